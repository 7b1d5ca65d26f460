// `mutwo-worker profile MODEL.pt --input ... --batch N [...]`: profiles one
// training step and prints the Profile as JSON, CSV or text on stdout.
// Bad arguments or a bad model: exit 2 and one line on stderr naming the
// problem. An out-of-memory is a result (oom: true), exit 0.
#ifndef MUTWO_WORKER_PROFILE_COMMAND_H_
#define MUTWO_WORKER_PROFILE_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/args.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

extern const char kProfileUsage[];

// The training-step flags `profile` and `execute` share (--input, --loss,
// --optimizer, --batch, --device, --warmup, --iterations, --seed,
// --memory_limit), parsed. InvalidArgument names the flag; the batch size is
// returned as given (each command checks it).
struct StepFlags {
  std::vector<v1::TensorSpec> inputs;
  v1::LossSpec loss;
  v1::OptimizerSpec optimizer;
  int64_t batch_size = 0;
  std::string device;
  int warmup_iterations = 0;
  int measure_iterations = 0;
  uint64_t seed = 0;
  int64_t memory_limit_bytes = 0;
};
[[nodiscard]] absl::StatusOr<StepFlags> ReadStepFlags(const ParsedArgs& args);

// Copies the flags into ProfilerOptions or ExecutorOptions.
template <typename Options>
void ApplyStepFlags(const StepFlags& flags, Options* options) {
  options->inputs = flags.inputs;
  options->loss = flags.loss;
  options->optimizer = flags.optimizer;
  options->batch_size = flags.batch_size;
  options->device = flags.device;
  options->warmup_iterations = flags.warmup_iterations;
  options->measure_iterations = flags.measure_iterations;
  options->seed = flags.seed;
  options->memory_limit_bytes = flags.memory_limit_bytes;
}

int RunProfileCommand(const ParsedArgs& args);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_PROFILE_COMMAND_H_
