// What a zip archive (a TorchScript .pt file) inflates to, read from its
// central directory without inflating anything: torch::jit::load allocates
// each record's uncompressed size (as the central directory states it) and
// inflates into it, so these sizes are the memory loading will take.
// Pure C++ (no LibTorch); thread-compatible.
#ifndef MUTWO_WORKER_ZIP_ARCHIVE_H_
#define MUTWO_WORKER_ZIP_ARCHIVE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mutwo::worker {

struct ZipInflation {
  int64_t records = 0;
  int64_t compressed_bytes = 0;    // sum over the records
  int64_t uncompressed_bytes = 0;  // sum over the records (zip64 included)
  // What kind of PyTorch archive: TorchScript archives hold code/ records,
  // torch.save's (a pickled module or state dict) hold data.pkl without.
  bool has_code = false;
  bool has_data_pickle = false;
};

// Sums the central directory's records. InvalidArgument when there is no
// end-of-central-directory record or the directory runs past the archive.
[[nodiscard]] absl::StatusOr<ZipInflation> ReadZipInflation(
    absl::string_view archive);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_ZIP_ARCHIVE_H_
