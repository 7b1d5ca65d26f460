// A mutwo schedule in a LibTorch training loop of your own.
//
//   torch::jit::Module model = torch::jit::load("model.pt");
//   mutwo::ScheduledStep step(model, mutwo::ReadScheduleFile("schedule.json"));
//   std::vector<torch::Tensor> params;
//   for (const auto& p : model.parameters()) params.push_back(p);
//   torch::optim::AdamW optimizer(params);
//   for (auto& [x, y] : loader) {
//     optimizer.zero_grad();
//     torch::Tensor loss = step.Run({x}, [&](const torch::IValue& out) {
//       return torch::nn::functional::cross_entropy(out.toTensor(), y);
//     });  // forward with the schedule applied, your loss, backward
//     optimizer.step();
//   }
//
// The schedule is what `mutwo schedule ... --output json` or `mutwo plan
// ... --output json` writes for this model (the same TorchScript file: its
// graph fingerprint is checked). The forward runs through mutwo's
// interpreter over the model's inlined graph with the schedule's
// recomputations and swaps (as `mutwo-worker execute` runs it); the loss is
// yours, and so are the data, the optimizer and the rest of the loop.
// Gradients equal those of model.forward + backward.
//
// Errors throw std::runtime_error with a message naming what was wrong
// (another model's schedule, a bad file, an out-of-memory in a step).
// Not thread-safe; one ScheduledStep per process at a time (on the CPU it
// installs mutwo's counting allocator, and it sets the RNG state of the
// replays process-wide, as the executor does).
#ifndef MUTWO_SCHEDULED_STEP_H_
#define MUTWO_SCHEDULED_STEP_H_

#include <torch/script.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mutwo {

// A schedule as JSON text (proto field names, `--output json`).
struct ScheduleJson {
  std::string text;
};

// Reads a schedule JSON file. Throws std::runtime_error.
ScheduleJson ReadScheduleFile(const std::string& path);

struct ScheduledStepOptions {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  // Refuse a schedule the planner marked infeasible (its budget is below
  // what the model needs); false runs it anyway.
  bool require_feasible = true;
};

// The loss `chunked_cross_entropy` (docs/loss.md) for your loss callback
// when the schedule was planned with it (the schedule's `loss`): the mean
// cross entropy of `logits` (classes in the last dimension: [N,V],
// [B,T,V]) against class indices `target` (the logits' shape without the
// last dimension), computed without a log-softmax of the whole output held,
// so the step peaks where the plan says. torch's cross_entropy holds one
// logits-sized tensor more. `reuse_logits`: you do not read `logits` after
// the backward, so it writes their gradient over them (the worker does, so
// its plans count one logits-sized tensor at the loss's backward, not two);
// it does not where another tensor shares their memory (a view of them, an
// autograd node's saved copy) or they are a leaf. Throws std::runtime_error
// naming shapes that do not fit.
torch::Tensor ChunkedCrossEntropy(const torch::Tensor& logits,
                                  const torch::Tensor& target,
                                  bool reuse_logits = false);

class ScheduledStep {
 public:
  // `model` is trained in place (its parameters get the gradients); it must
  // be the module the schedule was planned for. Throws std::runtime_error.
  // The module is checked against the schedule at the first Run: its
  // inputs' dtypes and shapes (the first dimension the batch) stand for the
  // input specs the schedule's profile had, which decide the control flow
  // the graph is specialised to (docs/profiler.md).
  ScheduledStep(const torch::jit::Module& model, const ScheduleJson& schedule,
                ScheduledStepOptions options = {});
  ~ScheduledStep();
  ScheduledStep(const ScheduledStep&) = delete;
  ScheduledStep& operator=(const ScheduledStep&) = delete;

  // One training step's forward (schedule applied) on `inputs` (forward's
  // arguments), `loss` on forward's output, and backward. Returns the loss
  // (detached). Gradients accumulate in the parameters' .grad. Throws
  // std::runtime_error, before running anything when `inputs` are not the
  // step the schedule was planned for (its recorded inputs at its batch
  // size: the budget holds for that step only), naming the input, its dtype
  // and shape and the planned ones. A schedule that records no inputs
  // holds every call to the first call's.
  torch::Tensor Run(
      const std::vector<torch::IValue>& inputs,
      const std::function<torch::Tensor(const torch::IValue&)>& loss);

  // What the schedule does: decisions to recompute and to swap.
  int recomputed() const;
  int swapped() const;
  // The executor's graph's once Run ran, the schedule's before.
  const std::string& graph_fingerprint() const;

  // The second Run's peak (the first after your optimizer made its state):
  // the device's high-water mark from its start to the end of its backward
  // (on CUDA the caching allocator's allocated bytes, on the CPU mutwo's
  // counting allocator: the worker's measure), what your loop holds
  // included; your optimizer step is not in it. 0 before the second Run.
  // When it is over the schedule's budget, Run logs a warning once (spdlog)
  // naming both: the budget does not hold in this loop (an optimizer with
  // more state than the planned one, tensors your loss keeps).
  int64_t measured_peak_bytes() const;
  bool over_budget() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mutwo

#endif  // MUTWO_SCHEDULED_STEP_H_
