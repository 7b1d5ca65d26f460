// Gradient memory of a recompute segment's backward (checkpoint.h): the
// autograd engine keeps the incoming gradients of a custom function alive for
// the whole call (its input list, CppNode's copy, the by-value argument),
// while the plain step frees each one after its first backward node. These
// helpers move such a gradient into a tensor the segment owns and free it
// once the replay's backward consumed it, so that a segment's backward holds
// what the plain step holds at the same steps.
//
// Internal to the worker (includes LibTorch's autograd hook header, not
// torch/torch.h). ExclusiveGradientUseCount() is thread-safe; the hooks run
// on the autograd engine's thread of the step that installed them.
#ifndef MUTWO_WORKER_GRADIENT_MEMORY_H_
#define MUTWO_WORKER_GRADIENT_MEMORY_H_

#include <torch/csrc/autograd/function_hook.h>

#include <cstdint>
#include <vector>

namespace mutwo::worker {

// How many references the autograd engine holds on a gradient it passes to
// a custom function's backward: measured once per process, on the first
// call, with a probe function (it depends on the LibTorch version). A
// gradient with no more references than this is owned by the engine call
// alone. Call it first outside any backward (the probe runs a backward of
// its own): SegmentRun::Forward does.
int64_t ExclusiveGradientUseCount();

// Moves the memory of an incoming gradient that only the engine call holds
// into a tensor of its own (the engine's copies keep an empty storage), so
// that the memory can be freed as soon as the replay's backward consumed
// it, as the plain step frees it after its first backward node. Returns
// `grad` itself when anything else may read it (another branch's buffer, a
// view): then it stays until the function returns.
at::Tensor TakeGradient(const at::Tensor& grad);

// A post hook for a replayed root node: after it ran, frees the memory of
// the gradients it consumed that TakeGradient made ours (`owned`), unless
// an output aliases them.
class FreeConsumedGradients : public torch::autograd::FunctionPostHook {
 public:
  explicit FreeConsumedGradients(std::vector<c10::StorageImpl*> owned)
      : owned_(std::move(owned)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& inputs) override;

 private:
  std::vector<c10::StorageImpl*> owned_;
};

// A pre hook for a replayed root node: before it runs, frees the memory of
// the gradients TakeGradient made ours (`owned`) that its inputs no longer
// hold. A root that also gets a gradient from inside the replay (a replayed
// output read again in the range, as a ResNet block's output is by the next
// block's first conv) has our gradient accumulated into a new tensor in its
// input buffer; the plain step frees it there, while the engine's own
// references (the function's inputs, the graph root) would keep it until
// the function returns.
class FreeAccumulatedGradients : public torch::autograd::FunctionPreHook {
 public:
  explicit FreeAccumulatedGradients(std::vector<c10::StorageImpl*> owned)
      : owned_(std::move(owned)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& grads) override;

 private:
  std::vector<c10::StorageImpl*> owned_;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_GRADIENT_MEMORY_H_
