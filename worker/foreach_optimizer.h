// The training step's optimizers (SGD, SGD with momentum, Adam, AdamW) with
// the arithmetic of LibTorch's torch::optim classes, run as multi-tensor
// (`_foreach_*`) kernels over chunks of the parameters: a handful of kernel
// launches per chunk instead of six to ten per parameter. PyTorch's Python
// optimizers do the same by default on CUDA (`foreach`), so a mutwo step and
// an eager one pay the same for the update; LibTorch's per-parameter loop
// added about 20 ms to ResNet-152's step on an H200 (467 parameter tensors).
//
// A chunk holds parameters of one device and dtype up to the size of the
// largest parameter, which bounds the update's temporaries (Adam's
// denominators, weight decay's sums) by what LibTorch's per-parameter loop
// held: the floor of a model whose optimizer step sets its peak stays where
// it was. With `all_at_once` a chunk holds all of them, as torch.optim's
// foreach implementation does: the step a user of its default on CUDA runs.
//
// Internal to the worker (includes LibTorch). Not thread-safe.
#ifndef MUTWO_WORKER_FOREACH_OPTIMIZER_H_
#define MUTWO_WORKER_FOREACH_OPTIMIZER_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace mutwo::worker {

struct ForeachOptions {
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kSgd;
  double lr = 1e-3;
  double momentum = 0;  // SGD; 0: none
  double weight_decay = 0;
  double beta1 = 0.9;  // Adam, AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
  // The update's temporaries span all parameters of one device and dtype
  // (torch.optim's foreach implementation), instead of chunks of at most
  // the largest parameter.
  bool all_at_once = false;
};

class ForeachOptimizer final : public torch::optim::Optimizer {
 public:
  // A tensor listed twice (a tied weight) is one parameter.
  ForeachOptimizer(const std::vector<torch::Tensor>& parameters,
                   const ForeachOptions& options);

  // One update of the parameters that have a gradient (others are skipped,
  // their state untouched, as LibTorch's optimizers do). Returns an
  // undefined tensor (`closure` must be null).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // State tensors held (momentum buffers, Adam's moments): what the
  // planner accounts per parameter (inputs.h, OptimizerStatesPerParameter).
  int64_t state_tensors() const;

 private:
  struct Chunk {
    std::vector<size_t> members;  // indices into params_
  };
  void StepSgd(const std::vector<size_t>& members);
  void StepAdam(const std::vector<size_t>& members);

  ForeachOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<Chunk> chunks_;
  // Per parameter: SGD's momentum buffer; Adam's moments and step count.
  std::vector<torch::Tensor> momentum_;
  std::vector<torch::Tensor> exp_avg_;
  std::vector<torch::Tensor> exp_avg_sq_;
  std::vector<int64_t> steps_;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_FOREACH_OPTIMIZER_H_
