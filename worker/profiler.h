// The op-level profiler: measures one model's training step at one batch
// size and fills a v1::Profile (see types.proto for every field and the
// timeline convention: forward node i at position i, backward step k at
// position nodes_size + k).
//
// Steps of Run():
//  1. Correctness: the module's own forward/backward and the interpreter's
//     are run with the same RNG seed; loss and gradients are compared.
//  2. The plain module training step (forward, loss, backward, optimizer),
//     warm-up then measured: module_peak_bytes, module_iteration_ms.
//  3. The interpreted step with hooks, warm-up then measured (medians):
//     per-node time and memory, per-backward-step time and memory (hooks on
//     every autograd node reached from the loss, each mapped to the IR node
//     that created it), and, from the allocator, every allocation made by a
//     node that is still alive at the end of forward (activations) with the
//     backward step that frees it.
// An out-of-memory anywhere is a result: Run() returns a profile with
// oom = true and oom_step naming where it happened.
//
// Not thread-safe, and one Profiler per process at a time: the allocator
// tags are process-wide.
#ifndef MUTWO_WORKER_PROFILER_H_
#define MUTWO_WORKER_PROFILER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"
#include "worker/step_options.h"

namespace mutwo::worker {

struct ProfilerOptions : TrainingStepOptions {
  std::string model_sha256;  // copied into the profile
};

class Profiler {
 public:
  // Validates the options, sets up the device (installing the counting CPU
  // allocator before the model is loaded, so parameters are counted), loads
  // the model and builds the IR. Errors: InvalidArgument naming the bad
  // option, input or model file.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Profiler>> Create(
      ProfilerOptions options);
  ~Profiler();

  // Errors: InvalidArgument when the inputs do not fit the model (naming
  // the node that rejected them), Internal for an unsupported graph.
  [[nodiscard]] absl::StatusOr<v1::Profile> Run();

  const std::string& graph_fingerprint() const;
  int num_nodes() const;

 private:
  struct State;
  explicit Profiler(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_PROFILER_H_
