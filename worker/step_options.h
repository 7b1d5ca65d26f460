// The options of one training step that the profiler and the executor share
// (and that `profile` and `execute` read from the same flags). Torch-free.
#ifndef MUTWO_WORKER_STEP_OPTIONS_H_
#define MUTWO_WORKER_STEP_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

struct TrainingStepOptions {
  std::string model_path;   // read when model_bytes is empty
  std::string model_bytes;  // the TorchScript archive itself
  std::string model_name;   // names the model in errors; default model_path
  std::vector<v1::TensorSpec> inputs;
  v1::LossSpec loss;
  v1::OptimizerSpec optimizer;
  int64_t batch_size = 0;
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  int warmup_iterations = 1;
  int measure_iterations = 3;
  // > 0: allocations beyond this many bytes fail like an out-of-memory
  // (the CPU counting allocator's limit; the CUDA memory fraction).
  int64_t memory_limit_bytes = 0;
  uint64_t seed = 0;
  // Build the IR specialised to the control flow the step takes on its
  // generated inputs (worker/specialize.h); false: prim::If / prim::Loop
  // stay opaque nodes. The profile and the execution of a schedule must
  // agree (the graph fingerprint differs). Off by default: on an H100 the
  // zoo's Transformer encoder measured 8.7% over its floor budget with it
  // (docs/profiler.md); on once the GPU zoo passes with it.
  bool specialize_control_flow = false;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_STEP_OPTIONS_H_
