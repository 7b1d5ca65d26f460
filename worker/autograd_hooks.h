// Small helpers the profiler and the executor share: autograd pre/post hooks
// that call a function, and the median of timings. Includes LibTorch: for
// worker/*.cc files only.
#ifndef MUTWO_WORKER_AUTOGRAD_HOOKS_H_
#define MUTWO_WORKER_AUTOGRAD_HOOKS_H_

#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace mutwo::worker {

// Calls `fn` before the autograd node runs; the gradients pass unchanged.
class CallbackPreHook : public torch::autograd::FunctionPreHook {
 public:
  explicit CallbackPreHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& grads) override {
    fn_();
    return grads;
  }

 private:
  std::function<void()> fn_;
};

// Calls `fn` after the autograd node ran; the outputs pass unchanged.
class CallbackPostHook : public torch::autograd::FunctionPostHook {
 public:
  explicit CallbackPostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// Median of `values` (the mean of the two middle ones for an even count);
// 0 for none.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid]
                                : (values[mid - 1] + values[mid]) / 2;
}

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_AUTOGRAD_HOOKS_H_
