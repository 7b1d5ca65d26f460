// A Chrome trace (PyTorch profiler / Kineto) of one training step: every
// ATen op on the CPU, every kernel and copy on a CUDA device, and the
// executor's own scopes (`mutwo::replay segment N`, `mutwo::offload ...`),
// so where a scheduled step spends its time can be read in Perfetto or
// chrome://tracing, or summarised by bench/executor/trace_summary.py.
//
// Internal to the worker (includes LibTorch). Not thread-safe: one trace at
// a time in the process (the profiler is process-wide).
#ifndef MUTWO_WORKER_STEP_TRACE_H_
#define MUTWO_WORKER_STEP_TRACE_H_

#include <torch/torch.h>

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace mutwo::worker {

// Runs `step` with the profiler on (CPU activity, and CUDA activity on a
// CUDA device) and writes the trace to `path` (JSON). `synchronize` runs
// before the profiler stops, so the device's work is in the trace.
// The folder of `path` is created. Errors: FailedPrecondition when this
// LibTorch was built without the Kineto profiler (nothing is written);
// Internal when the trace cannot be written; `step`'s own.
[[nodiscard]] absl::Status TraceStep(const std::string& path,
                                     const torch::Device& device,
                                     const std::function<absl::Status()>& step,
                                     const std::function<void()>& synchronize);

// Whether a trace can be written into folder `dir` (a one-op trace, then
// removed): the check before a long run. Errors: as TraceStep's.
[[nodiscard]] absl::Status ProbeStepTrace(const std::string& dir);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_STEP_TRACE_H_
