// The executor: runs real training steps (forward, loss, backward,
// optimizer step) with a v1::Schedule applied and proves it against the
// unmodified step in the same process.
//
// Run(schedule):
//  1. Refuses a schedule of another graph (graph_fingerprint) or batch size.
//  2. Correctness: one baseline and one scheduled step from the same
//     parameters, buffers and RNG seed (the module state is snapshotted and
//     put back in between, no optimizer step): loss, every gradient and the
//     buffers (batch-norm running statistics) after the step are compared.
//  3. Baseline steps, then scheduled steps, each warm-up + measured
//     iterations with the optimizer: peak bytes from the DeviceBackend
//     (reset per step; the counting allocator on CPU), median iteration time.
//
// RECOMPUTE: see checkpoint.h. SWAP: after `offload_after` (or the last
// forward read of any view of it, whichever is later) the producer's output
// storages go to host memory (swap.h); they come back in a pre-hook on the
// first backward node that reads them (the autograd nodes made by the
// producer or by a node reading the output, or a segment replay that takes
// it as input).
//
// An out-of-memory is a result (oom: true, error naming the step). Not
// thread-safe; one Executor per process at a time (the CPU allocator and
// RNG are process-wide).
#ifndef MUTWO_WORKER_EXECUTOR_H_
#define MUTWO_WORKER_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"
#include "worker/step_options.h"

// LibTorch types of the caller's-loop API below (kept out of this header).
namespace at {
class Tensor;
}  // namespace at
namespace c10 {
struct IValue;
}  // namespace c10
namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace mutwo::worker {

struct ExecutorOptions : TrainingStepOptions {
  // Gradients match when |scheduled - baseline| <= atol + rtol * S
  // element-wise, S the largest baseline gradient element of the step (the
  // replay reorders no arithmetic, but autograd may sum a gradient's
  // contributions in another order: a DenseNet feature map read by every
  // later layer of its block gets them in another order when a segment
  // returns its gradient. The rounding of such a sum scales with its terms,
  // not with the result: a batch-norm weight's gradient of 1.4e-5, a sum of
  // terms of ~1e-2 that cancel, differed by 5e-7 on the CPU. Batch-norm
  // statistics compare the same way, S per buffer.) On a GPU the steps run
  // with deterministic kernels where PyTorch has them, and a parameter may
  // also differ by twice what two plain steps differ by (ops with atomic
  // adds in backward, such as upsampling, have no deterministic kernel).
  // The comparison steps run in full fp32 (no TF32); still, summation order
  // alone moved Inception v3's Conv2d_2b_3x3 weight gradient by 1.01e-5 of
  // S at its floor on an H100 (4.96e-4 of 49.05): 1e-4 leaves that margin,
  // while a wrong gradient (a missed replay, a stale saved tensor) differs
  // by a large part of S.
  double grad_rtol = 1e-4;
  double grad_atol = 1e-7;
  // false: run only the scheduled step (no baseline step, no comparisons),
  // for batch sizes where the unmodified step does not fit.
  bool run_baseline = true;
  // Non-empty: after the timed steps, a Chrome trace of one unmodified step
  // (when run_baseline) and one scheduled step is written there
  // (unmodified.json, scheduled.json; step_trace.h).
  std::string trace_dir;
};

class Executor {
 public:
  // Validates the options, sets up the device (the counting CPU allocator
  // before the model is loaded), loads the model and rebuilds the IR.
  // With `module` (the caller's own, include/mutwo/scheduled_step.h) the
  // executor runs that object itself, moved to the options' device, and
  // options.model_bytes and model_path are unused: no second copy of the
  // model is loaded (ScheduledStep once loaded one: a second set of
  // parameters on the device during its first step, and the copy's
  // TorchScript sources held for the executor's life).
  // Errors: InvalidArgument naming the bad option, input or model.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Executor>> Create(
      ExecutorOptions options, const torch::jit::Module* module = nullptr);
  ~Executor();

  // Errors: InvalidArgument for a schedule of another graph (both
  // fingerprints named), another batch size, or a decision naming nodes the
  // graph does not have; InvalidArgument / Internal for a model that fails.
  // An out-of-memory is returned as a Validation with oom = true.
  [[nodiscard]] absl::StatusOr<v1::Validation> Run(
      const v1::Schedule& schedule);

  // A training loop of the caller's own (include/mutwo/scheduled_step.h):
  // checks and compiles `schedule` (its fingerprint; any batch size) for
  // UserStep, which runs the module the executor was created over (the
  // caller's, given to Create), so the caller's optimizer trains its own
  // parameters. Errors: InvalidArgument as for Run.
  [[nodiscard]] absl::Status PrepareUserStep(const v1::Schedule& schedule);
  // One forward of the prepared schedule on `inputs`, `loss` on the
  // forward's output, and backward: gradients accumulate in the module's
  // parameters (.grad), as after loss.backward(). Returns the loss.
  // Errors: ResourceExhausted for an out-of-memory, InvalidArgument naming
  // the step for other LibTorch errors (those of `loss` too).
  // `peak_bytes`: the device backend's high-water mark over the step (reset
  // when it starts; what the caller holds counts, as it does in the
  // worker's measure), written when the step succeeds.
  [[nodiscard]] absl::StatusOr<at::Tensor> UserStep(
      std::vector<c10::IValue> inputs,
      const std::function<at::Tensor(const c10::IValue&)>& loss,
      int64_t* peak_bytes = nullptr);

  const std::string& graph_fingerprint() const;
  int num_nodes() const;

 private:
  struct State;
  explicit Executor(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_EXECUTOR_H_
