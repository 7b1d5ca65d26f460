// Binds a job's input specs (`--input NAME:spec`) to a model's forward
// arguments: by name when the specs' names are forward's argument names (in
// any order), by position when none of them is; an argument without a spec
// is left out when it has a default or is Optional (None). One
// implementation for the worker (which reads the arguments from the loaded
// module) and the server and CLI (which read them from the archive's code,
// common/model_archive.h), so both refuse a job with the same message.
// Pure functions; thread-safe. Errors: InvalidArgument naming the argument
// and forward's signature.
#ifndef MUTWO_COMMON_FORWARD_BINDING_H_
#define MUTWO_COMMON_FORWARD_BINDING_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// One of forward's arguments (self excluded), as TorchScript declares it.
struct ForwardArgument {
  std::string name;
  std::string type;  // TorchScript's annotation: "Tensor", "Optional[Tensor]"
  std::optional<std::string> default_value;  // as printed: "None", "3"
};

// True when the argument may have no spec: it has a default or is Optional.
bool CanBeLeftOut(const ForwardArgument& argument);

// forward's signature as users read it: `forward(x: Tensor, mask:
// Optional[Tensor] = None)`.
std::string ForwardSignature(const std::vector<ForwardArgument>& arguments);

// For each argument, the index in `specs` of its spec, or -1 when it is
// left out. InvalidArgument for a spec naming no argument when others do,
// two specs for one argument, more specs than arguments, an argument
// without spec, default or Optional type, or a spec (always a tensor) bound
// to an argument declared otherwise than Tensor, Optional[Tensor] or Any
// (an `int`, `float`, `bool`...: the message names the argument, its type
// and the spec).
[[nodiscard]] absl::StatusOr<std::vector<int>> BindSpecsToArguments(
    const std::vector<ForwardArgument>& arguments,
    const std::vector<v1::TensorSpec>& specs);

}  // namespace mutwo

#endif  // MUTWO_COMMON_FORWARD_BINDING_H_
