// Binds the step's --input specs to forward's arguments: by name when the
// specs' names are forward's argument names (in any order), by position
// when none of them is; an argument without a spec is left out when it has
// a default (its default) or is Optional (None), and is then a constant of
// the graph, its branches on `is None` folded. Errors name the argument.
// The binding itself is common/forward_binding.h's, which mutwo-server
// also runs at submit over the archive's code: the same refusals, the same
// messages. Internal to the worker (includes LibTorch); pure functions.
#ifndef MUTWO_WORKER_FORWARD_INPUTS_H_
#define MUTWO_WORKER_FORWARD_INPUTS_H_

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

// A forward argument that no spec gives: bound to `value` in the graph.
struct OmittedArgument {
  int position = 0;  // among forward's arguments, self excluded
  std::string name;
  c10::IValue value;  // the argument's default, or None
};

struct ForwardBinding {
  // The specs in forward's argument order, the omitted arguments left out:
  // one per graph input after binding.
  std::vector<v1::TensorSpec> inputs;
  std::vector<OmittedArgument> omitted;  // by position
};

// Matches `specs` to `module`'s forward schema. InvalidArgument (naming the
// argument and forward's signature) for a spec naming no argument when
// others do, two specs for one argument, more specs than arguments, or an
// argument without spec, default or Optional type.
[[nodiscard]] absl::StatusOr<ForwardBinding> BindForwardInputs(
    const torch::jit::Module& module, const std::vector<v1::TensorSpec>& specs);

// Replaces the graph inputs of `omitted` (graph input 0 is self) by
// constants of their values and folds what that makes constant (`x is
// None`, the branches on it). The graph must be forward's, before any
// other input was removed.
void BindOmittedArguments(std::shared_ptr<torch::jit::Graph>& graph,
                          const std::vector<OmittedArgument>& omitted);

// forward's signature as users read it: `forward(x: Tensor, mask:
// Optional[Tensor] = None)`.
[[nodiscard]] std::string ForwardSignature(const torch::jit::Module& module);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_FORWARD_INPUTS_H_
