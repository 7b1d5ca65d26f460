// The set-up the profiler and the executor share: check the common options,
// create the device backend (before the model, so that the CPU counting
// allocator sees the parameters), load the model, build the IR, check that
// the inputs fit `forward`, and collect the trainable parameters.
// Includes LibTorch: for worker/*.cc files only.
#ifndef MUTWO_WORKER_TRAINING_SETUP_H_
#define MUTWO_WORKER_TRAINING_SETUP_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "worker/autograd_hooks.h"
#include "worker/forward_inputs.h"
#include "worker/graph.h"
#include "worker/inputs.h"
#include "worker/interpreter.h"
#include "worker/memory.h"
#include "worker/model_loader.h"
#include "worker/specialize.h"
#include "worker/step_options.h"

namespace mutwo::worker {

// Runs `fn`, turning LibTorch exceptions into a Status naming `where`:
// ResourceExhausted for an out-of-memory, InvalidArgument otherwise.
template <typename Fn>
absl::Status Guard(const std::string& where, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    const std::string what = ExceptionMessage(e);
    if (IsOutOfMemory(e)) {
      return absl::ResourceExhaustedError(absl::StrCat(where, ": ", what));
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  }
}

// What the profiler and the executor hold for their training steps (the
// base of their State structs).
struct TrainingState {
  torch::Device device{torch::kCPU};
  std::unique_ptr<DeviceBackend> backend;
  torch::jit::Module module;
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Interpreter> interpreter;
  std::vector<torch::Tensor> parameters;     // trainable
  std::vector<std::string> parameter_names;  // module paths, as `parameters`
  std::vector<c10::IValue> inputs;
  // forward's arguments no --input gives: constants of the graph.
  std::vector<OmittedArgument> omitted_arguments;
  std::vector<torch::Tensor> targets;  // the loss targets (MakeTargets)
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  // Where the step that is running now is, for OOM reports.
  std::string current_step;

  void ZeroGrads() {
    for (torch::Tensor& p : parameters) p.mutable_grad() = torch::Tensor();
  }

  // The optimizer's update of the parameters from their gradients (none
  // without an optimizer). Errors: Guard's.
  absl::Status OptimizerStep() {
    current_step = "optimizer step";
    return Guard(current_step, [&]() {
      if (optimizer) optimizer->step();
      return absl::OkStatus();
    });
  }

  // One timed training step: `step` (forward, loss, backward), then the
  // optimizer step; its time and the allocator's peak over it.
  absl::Status TimeOneStep(const std::function<absl::Status()>& step,
                           double* ms, int64_t* peak) {
    ZeroGrads();
    backend->Synchronize();
    backend->ClearMarks();
    backend->ResetPeak();
    const int start = backend->Mark();
    MUTWO_RETURN_IF_ERROR(step());
    MUTWO_RETURN_IF_ERROR(OptimizerStep());
    const int end = backend->Mark();
    backend->Synchronize();
    *ms = backend->ElapsedMs(start, end);
    *peak = backend->PeakBytes();
    return absl::OkStatus();
  }

  // `warmup` then `measure` timed training steps (TimeOneStep). The median
  // time of the measured ones and the allocator's peak over them.
  absl::Status TimedSteps(int warmup, int measure,
                          const std::function<absl::Status()>& step, double* ms,
                          int64_t* peak) {
    std::vector<double> times;
    *peak = 0;
    for (int it = 0; it < warmup + measure; ++it) {
      double one_ms = 0;
      int64_t one_peak = 0;
      MUTWO_RETURN_IF_ERROR(TimeOneStep(step, &one_ms, &one_peak));
      if (it >= warmup) {
        times.push_back(one_ms);
        *peak = std::max(*peak, one_peak);
      }
    }
    *ms = Median(times);
    return absl::OkStatus();
  }

  // Two steps timed in turns, as TimedSteps times one: `warmup` rounds,
  // then `measure` rounds, each running both, `first` first in even rounds
  // and `second` first in odd ones. A drift of the host or the device over
  // the measurement (clocks, other processes, the allocator's cache) falls
  // on both, so the ratio of their medians is the steps' own, and neither
  // always runs right after the other.
  absl::Status TimedStepPair(int warmup, int measure,
                             const std::function<absl::Status()>& first,
                             const std::function<absl::Status()>& second,
                             double ms[2], int64_t peak[2]) {
    std::vector<double> times[2];
    peak[0] = peak[1] = 0;
    const std::function<absl::Status()>* steps[2] = {&first, &second};
    for (int it = 0; it < warmup + measure; ++it) {
      for (int turn = 0; turn < 2; ++turn) {
        const int which = (it % 2 == 0) ? turn : 1 - turn;
        double one_ms = 0;
        int64_t one_peak = 0;
        MUTWO_RETURN_IF_ERROR(TimeOneStep(*steps[which], &one_ms, &one_peak));
        if (it >= warmup) {
          times[which].push_back(one_ms);
          peak[which] = std::max(peak[which], one_peak);
        }
      }
    }
    for (int which = 0; which < 2; ++which) ms[which] = Median(times[which]);
    return absl::OkStatus();
  }
};

// The IR of the step: specialised to the control flow it takes on the
// inputs generated from `options` (the same for the profiler and the
// executor: same specs, batch size and seed, same graph), unless
// options.specialize_control_flow is off. Errors: those of Graph::Create,
// or inputs that cannot be generated.
[[nodiscard]] inline absl::StatusOr<std::unique_ptr<Graph>> CreateTrainingGraph(
    const TrainingStepOptions& options, const TrainingState& state) {
  if (!options.specialize_control_flow) {
    return Graph::Create(state.module, state.omitted_arguments);
  }
  // The recording reseeds (MakeInputs) and draws (dropout) random numbers;
  // the caller's generator state is put back (ScheduledStep builds this at
  // its first step, after the caller seeded for it).
  std::vector<std::pair<at::Generator, torch::Tensor>> generators;
  for (const torch::Device& device :
       {torch::Device(torch::kCPU), state.device}) {
    if (!generators.empty() && device.is_cpu()) continue;
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generators.emplace_back(generator, generator.get_state());
  }
  struct RestoreGenerators {
    std::vector<std::pair<at::Generator, torch::Tensor>>* saved;
    ~RestoreGenerators() {
      for (auto& [generator, rng_state] : *saved) {
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_state(rng_state);
      }
    }
  } restore_generators{&generators};
  std::vector<c10::IValue> inputs;
  MUTWO_RETURN_IF_ERROR(Guard(
      "generating inputs to specialise control flow", [&]() -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(std::vector<torch::Tensor> tensors,
                               MakeInputs(options.inputs, options.batch_size,
                                          state.device, options.seed));
        inputs.assign(tensors.begin(), tensors.end());
        return absl::OkStatus();
      }));
  SpecializeStats stats;
  SpecializeOptions specialize;
  specialize.omitted_arguments = state.omitted_arguments;
  auto graph = CreateSpecializedGraph(state.module, inputs, specialize, &stats);
  if (!stats.recording_error.empty()) {
    // Debug, not a warning: the step fails the same way and says so.
    MUTWO_LOG(debug,
              "model {}: control flow not specialised (forward failed on the "
              "generated inputs: {})",
              options.model_name, stats.recording_error);
  } else if (graph.ok()) {
    MUTWO_LOG(debug,
              "model {}: {} loops unrolled, {} branches specialised, {} "
              "prim::If left",
              options.model_name, stats.loops_unrolled, stats.ifs_specialized,
              stats.ifs_kept);
  }
  return graph;
}

// Sets device, backend, module, graph, interpreter and parameters of
// `state` (fills in options.model_name). The module is loaded from the
// options' bytes or file, or is `module` (the caller's, moved to the
// device) when given. Errors: InvalidArgument naming the bad option,
// device, model file or input count.
[[nodiscard]] inline absl::Status SetUpTraining(
    TrainingStepOptions& options, TrainingState* state,
    const torch::jit::Module* module = nullptr) {
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size must be a positive integer, got ", options.batch_size));
  }
  if (options.warmup_iterations < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warm-up iterations must be >= 0, got ", options.warmup_iterations));
  }
  if (options.measure_iterations < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "measured iterations must be >= 1, got ", options.measure_iterations));
  }
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError(
        "no inputs: give one --input NAME:DTYPE[DIMS] per forward argument");
  }
  MUTWO_RETURN_IF_ERROR(ValidateInputs(options.inputs));
  if (options.model_name.empty()) options.model_name = options.model_path;

  MUTWO_ASSIGN_OR_RETURN(
      state->backend,
      CreateDeviceBackend(options.device, options.memory_limit_bytes));
  try {
    state->device =
        state->backend->kind() == "cpu"
            ? torch::Device(torch::kCPU)
            : torch::Device(options.device == "cuda" ? std::string("cuda:0")
                                                     : options.device);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", options.device, "\": ", FirstLine(e.msg())));
  }
  // Loaded after the backend exists, so that the counting allocator sees the
  // parameters.
  if (module != nullptr) {
    // The caller's own object (a handle), trained in place.
    MUTWO_RETURN_IF_ERROR(Guard("moving the module to the device", [&]() {
      state->module = *module;
      state->module.to(state->device);
      return absl::OkStatus();
    }));
  } else if (options.model_bytes.empty()) {
    MUTWO_ASSIGN_OR_RETURN(state->module,
                           LoadModuleFile(options.model_path, state->device));
  } else {
    MUTWO_ASSIGN_OR_RETURN(
        state->module,
        LoadModule(options.model_bytes, options.model_name, state->device));
  }
  // The specs in forward's order, by name where they name its arguments;
  // the arguments left out are constants of the graph.
  auto binding = BindForwardInputs(state->module, options.inputs);
  if (!binding.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", options.model_name, ": ", binding.status().message()));
  }
  options.inputs = binding->inputs;
  state->omitted_arguments = binding->omitted;
  auto graph = CreateTrainingGraph(options, *state);
  if (!graph.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", options.model_name, ": ", graph.status().message()));
  }
  state->graph = *std::move(graph);
  // The forward runs that recorded branches are not part of any step.
  state->backend->ResetPeak();
  if (state->graph->num_inputs() != static_cast<int>(options.inputs.size())) {
    // Bound above; a graph that still disagrees is an IR bug, said plainly.
    return absl::InvalidArgumentError(
        absl::StrCat("model ", options.model_name, ": forward takes ",
                     state->graph->num_inputs(), " inputs, got ",
                     options.inputs.size(), " --input specs"));
  }
  state->interpreter = std::make_unique<Interpreter>(state->graph.get());
  for (const auto& p : state->module.named_parameters()) {
    if (!p.value.requires_grad()) continue;
    state->parameters.push_back(p.value);
    state->parameter_names.push_back(p.name);
  }
  return absl::OkStatus();
}

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_TRAINING_SETUP_H_
