// What can be known of a TorchScript archive without LibTorch, so that a
// job that cannot run is refused before it is queued, with the messages
// the worker would give when it loads the model:
// - CheckModelArchive: the file is a TorchScript archive at all (not
//   empty, not a torch.save pickle, a readable zip, not a zip bomb). The
//   worker calls it before torch::jit::load.
// - ReadForwardSchema: forward's arguments, read from the archive's code:
//   the top-level class is named by data.pkl's first GLOBAL opcode
//   (`__torch__.X.Y`), its code record `code/__torch__/X.py` declares
//   `def forward(self, a: Tensor, b: Optional[Tensor]=None) -> ...`.
//   Scripted and traced models both have it. Code that cannot be read this
//   way leaves the schema unknown (never refused: the worker decides).
// - CheckModelInputs: both, then the specs bound to the arguments
//   (common/forward_binding.h).
// Pure functions over bytes the caller owns; thread-safe.
#ifndef MUTWO_COMMON_MODEL_ARCHIVE_H_
#define MUTWO_COMMON_MODEL_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/forward_binding.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// An archive may inflate (records' uncompressed sizes, what loading
// allocates) to this many times its size, or to the allowance, whichever is
// more; more is refused as a zip bomb before loading.
inline constexpr int64_t kMaxInflationRatio = 8;
inline constexpr int64_t kMinInflationAllowanceBytes = int64_t{64} << 20;

// InvalidArgument, naming `what` (a path or a model name) and saying what
// to do, for an empty file, a torch.save pickle (legacy or zip), bytes
// that are no zip archive, a truncated or corrupt zip directory, or an
// archive that inflates beyond kMaxInflationRatio.
[[nodiscard]] absl::Status CheckModelArchive(absl::string_view bytes,
                                             absl::string_view what);

struct ForwardSchema {
  bool known = false;
  // Why forward's arguments could not be read (known == false).
  std::string unknown_reason;
  std::string class_name;                  // `__torch__.Net`
  std::vector<ForwardArgument> arguments;  // self excluded
};

// forward's arguments of the archive's top-level module. Never an error:
// an archive whose code is not read (see above) gives known == false.
ForwardSchema ReadForwardSchema(absl::string_view bytes);

// CheckModelArchive, then `inputs` bound to forward's arguments where they
// are known. InvalidArgument as those two, prefixed `model WHAT: `. On OK,
// `*schema` (may be null) tells whether the binding was checked.
[[nodiscard]] absl::Status CheckModelInputs(
    absl::string_view bytes, absl::string_view what,
    const std::vector<v1::TensorSpec>& inputs, ForwardSchema* schema);

// CheckModelInputs over the file at `path`, mapped rather than read (a
// model may be GiBs; only its directory and code are touched). A file that
// cannot be opened or mapped is an Internal error, not the model's fault.
[[nodiscard]] absl::Status CheckModelFileInputs(
    const std::string& path, absl::string_view what,
    const std::vector<v1::TensorSpec>& inputs, ForwardSchema* schema);

}  // namespace mutwo

#endif  // MUTWO_COMMON_MODEL_ARCHIVE_H_
