#include "worker/executor.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "worker/alias.h"
#include "worker/autograd_hooks.h"
#include "worker/checkpoint.h"
#include "worker/execution_plan.h"
#include "worker/graph.h"
#include "worker/inputs.h"
#include "worker/interpreter.h"
#include "worker/memory.h"
#include "worker/model_loader.h"
#include "worker/step_run.h"
#include "worker/step_trace.h"
#include "worker/swap.h"
#include "worker/training_setup.h"

namespace mutwo::worker {
namespace {

// Deterministic cuDNN algorithms and deterministic kernels of the other ops
// that have them while in scope (the previous settings restored after).
class DeterministicKernels {
 public:
  DeterministicKernels()
      : previous_(at::globalContext().deterministicCuDNN()),
        previous_algorithms_(at::globalContext().deterministicAlgorithms()),
        previous_warn_only_(
            at::globalContext().deterministicAlgorithmsWarnOnly()),
        previous_tf32_cudnn_(at::globalContext().allowTF32CuDNN()),
        previous_tf32_cublas_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setDeterministicCuDNN(true);
    // Also the deterministic kernels of the other ops that have them
    // (index_add, scatter_add, ...); warn_only: an op without one (upsample
    // backward on CUDA) runs as it is, and the comparison measures that
    // noise with a second plain step.
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    // And full fp32: TF32 (cuDNN's default for convolutions on Ampere and
    // later) rounds the operands to 10 mantissa bits, which turns autograd's
    // changed summation order under segments (a GoogLeNet inception input's
    // four branch gradients) into differences of 2.5e-5 of the step's
    // largest gradient on an H100, above the tolerance.
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~DeterministicKernels() {
    at::globalContext().setDeterministicCuDNN(previous_);
    at::globalContext().setDeterministicAlgorithms(previous_algorithms_,
                                                   previous_warn_only_);
    at::globalContext().setAllowTF32CuDNN(previous_tf32_cudnn_);
    at::globalContext().setAllowTF32CuBLAS(previous_tf32_cublas_);
  }
  DeterministicKernels(const DeterministicKernels&) = delete;
  DeterministicKernels& operator=(const DeterministicKernels&) = delete;

 private:
  bool previous_;
  bool previous_algorithms_;
  bool previous_warn_only_;
  bool previous_tf32_cudnn_;
  bool previous_tf32_cublas_;
};

// What one comparison step left: its loss, gradients and buffers (as
// float64, to compare).
struct Outcome {
  double loss = 0;
  std::vector<torch::Tensor> grads, buffers;
};

// The module's parameters and buffers, and (with `copy`) copies of them, so
// that each comparison step starts from the same state.
class ModuleSnapshot {
 public:
  ModuleSnapshot(const torch::jit::Module& module, bool copy) {
    for (const torch::Tensor& p : module.parameters()) params_.push_back(p);
    for (const torch::Tensor& b : module.buffers()) buffers_.push_back(b);
    if (!copy) return;
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : params_) param_copies_.push_back(p.clone());
    for (const torch::Tensor& b : buffers_) buffer_copies_.push_back(b.clone());
  }
  const std::vector<torch::Tensor>& buffers() const { return buffers_; }
  void Restore() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].copy_(param_copies_[i]);
    }
    for (size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].copy_(buffer_copies_[i]);
    }
  }
  // The copies are gone before the timed steps (they would count).
  void DropCopies() {
    param_copies_.clear();
    buffer_copies_.clear();
  }

 private:
  std::vector<torch::Tensor> params_, buffers_, param_copies_, buffer_copies_;
};

// Whether the scheduled step's buffers (batch-norm statistics) equal the
// unmodified step's, within the gradient tolerances.
bool BuffersMatch(const Outcome& base, const Outcome& sched,
                  const ExecutorOptions& o) {
  bool match = true;
  for (size_t i = 0; i < base.buffers.size(); ++i) {
    if (base.buffers[i].numel() == 0) continue;
    // Equal elements (infinities too: a causal mask buffer holds -inf,
    // and -inf - -inf is NaN) differ by nothing; the scale is that of
    // the finite ones.
    const torch::Tensor& a = sched.buffers[i];
    const torch::Tensor& b = base.buffers[i];
    const torch::Tensor same =
        a.eq(b).logical_or(a.isnan().logical_and(b.isnan()));
    const torch::Tensor diff = (a - b).abs().masked_fill(same, 0);
    const double scale =
        b.masked_fill(b.isfinite().logical_not(), 0).abs().max().item<double>();
    match &= diff.max().item<double>() <= o.grad_atol + o.grad_rtol * scale;
  }
  return match;
}

}  // namespace

struct Executor::State : TrainingState {
  ExecutorOptions options;
  // The schedule being run, compiled (execution_plan.h).
  ExecutionPlan compiled;
  // The caller's loss (UserStep); unset: the options' loss and target.
  std::function<torch::Tensor(const c10::IValue&)> user_loss;

  // One forward + loss + backward; `scheduled` applies the schedule.
  // Returns the loss.
  absl::StatusOr<torch::Tensor> Step(bool scheduled);
  // The timed steps: the unmodified and the scheduled one in turns, or the
  // scheduled one alone when the options skip the baseline.
  absl::Status TimedSteps(v1::Validation* validation);

  // Executor::Run's phases, each filling its part of `validation`.
  // Inputs, target and optimizer for the options' batch size and seed.
  absl::Status GenerateInputs();
  // Correctness: the unmodified and the scheduled step from one state.
  absl::Status CompareWithBaseline(ModuleSnapshot& snapshot,
                                   v1::Validation* validation);
  // One comparison step from the snapshot's state, with the step's seed.
  absl::Status OneStep(bool scheduled, ModuleSnapshot& snapshot, Outcome* out);
  // Whether each gradient of `sched` is within the tolerance of `base`
  // (and of the noise between `base` and `again`, when there is `again`);
  // names the worst parameter in `validation`.
  bool GradientsMatch(const Outcome& base, const Outcome& sched,
                      const Outcome& again, v1::Validation* validation,
                      double* max_diff);
  // The comparison (unless the options skip the baseline), then the timed
  // steps.
  absl::Status Validate(v1::Validation* validation);
};

absl::StatusOr<torch::Tensor> Executor::State::Step(bool scheduled) {
  std::unique_ptr<StepRun> run;
  InterpreterHooks hooks;
  if (scheduled) {
    // `--log_level trace`: allocations are tagged with the forward node that
    // made them, and what is resident after the loss is listed by node.
    const bool tracing =
        spdlog::should_log(spdlog::level::trace) && backend->SupportsTracking();
    run = std::make_unique<StepRun>(
        StepContext{&compiled, graph.get(), interpreter.get(), &module, device,
                    backend.get(), &current_step},
        tracing);
    hooks = run->ForwardHooks();
  }

  current_step = "forward";
  absl::StatusOr<c10::IValue> outputs = interpreter->Run(module, inputs, hooks);
  if (!outputs.ok()) {
    if (absl::IsResourceExhausted(outputs.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat(current_step, ": ", outputs.status().message()));
    }
    return outputs.status();
  }
  torch::Tensor loss;
  current_step = "loss";
  MUTWO_RETURN_IF_ERROR(Guard(current_step, [&]() {
    if (user_loss) {
      loss = user_loss(*outputs);
    } else {
      MUTWO_ASSIGN_OR_RETURN(loss,
                             ComputeLoss(options.loss, *outputs, targets));
    }
    if (!loss.requires_grad()) {
      return absl::InvalidArgumentError(
          "the loss does not depend on any trainable parameter");
    }
    return absl::OkStatus();
  }));
  outputs = c10::IValue();

  if (scheduled) {
    run->HookBackward();
    if (spdlog::should_log(spdlog::level::trace)) run->TraceBackward();
  }
  current_step = "backward";
  MUTWO_RETURN_IF_ERROR(Guard(current_step, [&]() {
    loss.backward();
    return absl::OkStatus();
  }));
  return loss.detach();
}

absl::Status Executor::State::TimedSteps(v1::Validation* validation) {
  const auto step = [this](bool scheduled) {
    return [this, scheduled]() { return Step(scheduled).status(); };
  };
  if (!options.run_baseline) {
    double ms = 0;
    int64_t peak = 0;
    MUTWO_RETURN_IF_ERROR(TrainingState::TimedSteps(options.warmup_iterations,
                                                    options.measure_iterations,
                                                    step(true), &ms, &peak));
    validation->mutable_scheduled()->set_peak_bytes(peak);
    validation->mutable_scheduled()->set_iteration_ms(ms);
    return absl::OkStatus();
  }
  // In turns: the overhead a validation reports is a ratio of the two.
  double ms[2] = {0, 0};
  int64_t peak[2] = {0, 0};
  MUTWO_RETURN_IF_ERROR(TimedStepPair(options.warmup_iterations,
                                      options.measure_iterations, step(false),
                                      step(true), ms, peak));
  for (const int which : {0, 1}) {
    v1::StepStats* stats = which == 0 ? validation->mutable_baseline()
                                      : validation->mutable_scheduled();
    stats->set_peak_bytes(peak[which]);
    stats->set_iteration_ms(ms[which]);
  }
  return absl::OkStatus();
}

namespace {

// The schedule was planned from a profile of this graph. On a mismatch the
// IR goes to the debug log, so that two builds of one file that disagree
// can be compared.
absl::Status CheckFingerprint(const v1::Schedule& schedule, const Graph& graph,
                              const std::string& model_name) {
  if (schedule.graph_fingerprint() == graph.fingerprint()) {
    return absl::OkStatus();
  }
  MUTWO_LOG(debug, "IR of {} (fingerprint {}):\n{}", model_name,
            graph.fingerprint(), graph.graph()->toString());
  return absl::InvalidArgumentError(absl::StrCat(
      "the schedule is for graph fingerprint \"", schedule.graph_fingerprint(),
      "\" but model ", model_name, " has graph fingerprint \"",
      graph.fingerprint(), "\" (", graph.num_nodes(),
      " IR nodes; plan it from a profile of this model)"));
}

}  // namespace

absl::Status Executor::State::GenerateInputs() {
  const ExecutorOptions& o = options;
  current_step = "generating inputs";
  return Guard(current_step, [&]() -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(std::vector<torch::Tensor> made,
                           MakeInputs(o.inputs, o.batch_size, device, o.seed));
    MUTWO_ASSIGN_OR_RETURN(targets, MakeTargets(o.loss, o.batch_size, device));
    inputs.assign(made.begin(), made.end());
    MUTWO_ASSIGN_OR_RETURN(optimizer, MakeOptimizer(o.optimizer, parameters));
    return absl::OkStatus();
  });
}

absl::Status Executor::State::OneStep(bool scheduled, ModuleSnapshot& snapshot,
                                      Outcome* out) {
  snapshot.Restore();
  ZeroGrads();
  torch::manual_seed(options.seed + 1);
  MUTWO_ASSIGN_OR_RETURN(torch::Tensor loss, Step(scheduled));
  return Guard("comparing", [&]() {
    out->loss = loss.item<double>();
    for (size_t i = 0; i < parameters.size(); ++i) {
      const torch::Tensor& p = parameters[i];
      const torch::Tensor& g = p.grad();
      // A gradient whose memory a schedule's hook released would read
      // freed memory (on CUDA an illegal address, reported much later).
      if (g.defined() && g.numel() > 0 &&
          (!g.has_storage() || g.storage().data() == nullptr)) {
        return absl::InternalError(absl::StrCat(
            "the ", scheduled ? "scheduled" : "unmodified",
            " step left the gradient of parameter ", parameter_names[i],
            " without memory (released while still the parameter's "
            ".grad)"));
      }
      out->grads.push_back(p.grad().defined()
                               ? p.grad().to(torch::kFloat64)
                               : torch::zeros_like(p, torch::kFloat64));
    }
    for (const torch::Tensor& b : snapshot.buffers()) {
      out->buffers.push_back(b.to(torch::kFloat64));
    }
    return absl::OkStatus();
  });
}

bool Executor::State::GradientsMatch(const Outcome& base, const Outcome& sched,
                                     const Outcome& again,
                                     v1::Validation* validation,
                                     double* max_diff) {
  const ExecutorOptions& o = options;
  bool match = true;
  double worst_excess = 0;
  double scale = 0;  // the largest gradient element of the step
  for (const torch::Tensor& g : base.grads) {
    if (g.numel() > 0) scale = std::max(scale, g.abs().max().item<double>());
  }
  for (size_t i = 0; i < base.grads.size(); ++i) {
    const torch::Tensor diff = (sched.grads[i] - base.grads[i]).abs();
    if (diff.numel() == 0) continue;
    const double worst = diff.max().item<double>();
    *max_diff = std::max(*max_diff, worst);
    const double noise =
        again.grads.empty()
            ? 0.0
            : (again.grads[i] - base.grads[i]).abs().max().item<double>();
    const double excess =
        worst - (o.grad_atol + o.grad_rtol * scale + 2 * noise);
    if (excess > 0) {
      match = false;
      if (excess > worst_excess) {
        worst_excess = excess;
        validation->set_worst_gradient_parameter(parameter_names[i]);
      }
      MUTWO_LOG(warn,
                "gradient of parameter {} differs by up to {} (largest "
                "gradient element of the step: {}; two plain steps "
                "differ by {})",
                parameter_names[i], worst, scale, noise);
    }
  }
  return match;
}

absl::Status Executor::State::CompareWithBaseline(ModuleSnapshot& snapshot,
                                                  v1::Validation* validation) {
  Outcome base, sched, again;
  {
    // cuDNN's default algorithms are not deterministic (two plain steps
    // of a ResNet-50 differ by 0.03 of 26.7 on an H200): the comparison
    // steps use deterministic ones, so a difference is the schedule's.
    // The timed steps keep the default.
    DeterministicKernels deterministic;
    MUTWO_RETURN_IF_ERROR(OneStep(false, snapshot, &base));
    // On a GPU some ops have no deterministic kernel (atomic adds in
    // upsample and pooling backward): a second plain step measures how
    // far two unmodified steps differ, and a schedule may differ that
    // much too. The CPU's kernels are deterministic.
    if (device.is_cuda()) {
      MUTWO_RETURN_IF_ERROR(OneStep(false, snapshot, &again));
    }
    MUTWO_RETURN_IF_ERROR(OneStep(true, snapshot, &sched));
  }
  snapshot.Restore();
  ZeroGrads();
  double max_diff = 0;
  const bool match = GradientsMatch(base, sched, again, validation, &max_diff);
  const bool buffers_match = BuffersMatch(base, sched, options);
  validation->set_loss_diff(std::abs(sched.loss - base.loss));
  snapshot.DropCopies();
  validation->set_gradients_match(match);
  validation->set_max_abs_grad_diff(max_diff);
  validation->set_batchnorm_stats_match(buffers_match);
  return absl::OkStatus();
}

absl::Status Executor::State::Validate(v1::Validation* validation) {
  backend->SetTag(kIdleTag);
  *validation->mutable_device() = backend->Describe();
  MUTWO_RETURN_IF_ERROR(GenerateInputs());
  ModuleSnapshot snapshot(module, /*copy=*/options.run_baseline);
  if (options.run_baseline) {
    MUTWO_RETURN_IF_ERROR(CompareWithBaseline(snapshot, validation));
  } else {
    // Only the scheduled step (the unmodified one may not fit).
    validation->set_baseline_skipped(true);
    validation->set_gradients_match(false);
    validation->set_max_abs_grad_diff(0);
    validation->set_batchnorm_stats_match(false);
  }
  MUTWO_RETURN_IF_ERROR(TimedSteps(validation));
  if (options.trace_dir.empty()) return absl::OkStatus();
  for (const bool scheduled : {false, true}) {
    if (!scheduled && !options.run_baseline) continue;
    const std::string path =
        (std::filesystem::path(options.trace_dir) /
         (scheduled ? "scheduled.json" : "unmodified.json"))
            .string();
    MUTWO_RETURN_IF_ERROR(TraceStep(
        path, device,
        [&]() {
          ZeroGrads();
          backend->Synchronize();
          MUTWO_RETURN_IF_ERROR(Step(scheduled).status());
          return OptimizerStep();
        },
        [&]() { backend->Synchronize(); }));
  }
  return absl::OkStatus();
}

Executor::Executor(std::unique_ptr<State> state) : state_(std::move(state)) {}
Executor::~Executor() = default;

const std::string& Executor::graph_fingerprint() const {
  return state_->graph->fingerprint();
}
int Executor::num_nodes() const { return state_->graph->num_nodes(); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    ExecutorOptions options, const torch::jit::Module* module) {
  auto state = std::make_unique<State>();
  MUTWO_RETURN_IF_ERROR(SetUpTraining(options, state.get(), module));
  state->options = std::move(options);
  return std::unique_ptr<Executor>(new Executor(std::move(state)));
}

absl::StatusOr<v1::Validation> Executor::Run(const v1::Schedule& schedule) {
  State& s = *state_;
  const ExecutorOptions& o = s.options;
  MUTWO_RETURN_IF_ERROR(CheckFingerprint(schedule, *s.graph, o.model_name));
  if (schedule.batch_size() != o.batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the schedule is for batch size ", schedule.batch_size(),
                     ", the executor runs batch size ", o.batch_size));
  }
  MUTWO_ASSIGN_OR_RETURN(s.compiled, CompileSchedule(*s.graph, schedule));

  v1::Validation validation;
  validation.set_graph_fingerprint(s.graph->fingerprint());
  validation.set_batch_size(o.batch_size);
  validation.mutable_predicted()->set_peak_bytes(
      schedule.predicted_peak_bytes());
  validation.mutable_predicted()->set_iteration_ms(
      schedule.predicted_iteration_ms());
  validation.mutable_predicted_baseline()->set_peak_bytes(
      schedule.baseline_peak_bytes());
  validation.mutable_predicted_baseline()->set_iteration_ms(
      schedule.baseline_iteration_ms());
  validation.set_budget_bytes(schedule.budget_bytes());
  int recomputed = 0, swapped = 0;
  for (const v1::Decision& d : schedule.decisions()) {
    recomputed += d.action() == v1::Decision::RECOMPUTE;
    swapped += d.action() == v1::Decision::SWAP;
  }
  validation.set_recomputed(recomputed);
  validation.set_swapped(swapped);

  const absl::Status result = s.Validate(&validation);
  s.ZeroGrads();
  s.optimizer.reset();
  if (absl::IsResourceExhausted(result)) {
    validation.set_oom(true);
    validation.set_error(std::string(result.message()));
    return validation;
  }
  if (!result.ok()) {
    return absl::Status(result.code(), absl::StrCat("model ", o.model_name,
                                                    ": ", result.message()));
  }
  validation.set_within_budget(schedule.budget_bytes() <= 0 ||
                               validation.scheduled().peak_bytes() <=
                                   schedule.budget_bytes());
  return validation;
}

absl::Status Executor::PrepareUserStep(const v1::Schedule& schedule) {
  State& s = *state_;
  MUTWO_RETURN_IF_ERROR(
      CheckFingerprint(schedule, *s.graph, s.options.model_name));
  MUTWO_ASSIGN_OR_RETURN(s.compiled, CompileSchedule(*s.graph, schedule));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> Executor::UserStep(
    std::vector<c10::IValue> inputs,
    const std::function<torch::Tensor(const c10::IValue&)>& loss,
    int64_t* peak_bytes) {
  State& s = *state_;
  s.inputs = std::move(inputs);
  s.user_loss = loss;
  if (peak_bytes != nullptr) {
    s.backend->Synchronize();
    s.backend->ResetPeak();
  }
  absl::StatusOr<torch::Tensor> out = s.Step(/*scheduled=*/true);
  s.user_loss = nullptr;
  s.inputs.clear();  // the caller's tensors are not held between steps
  if (peak_bytes != nullptr && out.ok()) {
    s.backend->Synchronize();
    *peak_bytes = s.backend->PeakBytes();
  }
  return out;
}

}  // namespace mutwo::worker
