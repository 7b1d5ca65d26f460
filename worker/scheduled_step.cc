// include/mutwo/scheduled_step.h over the executor (worker/executor.h): the
// caller's module is saved to bytes, from which the executor builds the same
// IR as the profiler did (the fingerprint the schedule names), then runs the
// caller's own module object with the caller's inputs and loss.
#include "mutwo/scheduled_step.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "mutwo/v1/types.pb.h"
#include "spdlog/spdlog.h"
#include "worker/chunked_cross_entropy.h"
#include "worker/executor.h"
#include "worker/inputs.h"

namespace mutwo {
namespace {

void ThrowIfError(const absl::Status& status, const std::string& what) {
  if (!status.ok()) {
    throw std::runtime_error(
        absl::StrCat("mutwo: ", what, ": ", status.message()));
  }
}

}  // namespace

torch::Tensor ChunkedCrossEntropy(const torch::Tensor& logits,
                                  const torch::Tensor& target,
                                  bool reuse_logits) {
  if (!logits.is_floating_point() || target.scalar_type() != torch::kLong ||
      !worker::ClassesLast(logits, target) || target.numel() == 0) {
    throw std::runtime_error(absl::StrCat(
        "mutwo::ChunkedCrossEntropy: logits [",
        absl::StrJoin(logits.sizes(), ","), "] (",
        std::string(c10::toString(logits.scalar_type())), ") and target [",
        absl::StrJoin(target.sizes(), ","), "] (",
        std::string(c10::toString(target.scalar_type())),
        ") do not fit: floating-point logits with classes in the last "
        "dimension, int64 class indices shaped like the logits without it"));
  }
  return worker::ChunkedCrossEntropy(logits, target,
                                     reuse_logits
                                         ? worker::LogitsReuse::kCallerDone
                                         : worker::LogitsReuse::kNever);
}

ScheduleJson ReadScheduleFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  ThrowIfError(text.status(), absl::StrCat("schedule ", path));
  return ScheduleJson{*std::move(text)};
}

namespace {

// A spec of `input` (forward's argument `index`) for the executor's
// generated inputs, with the first dimension as the batch: dtype and shape
// as the caller's, integers drawn from the range the caller's values span.
// A non-tensor gets a float [B] placeholder.
v1::TensorSpec SpecOf(const torch::IValue& input, size_t index) {
  v1::TensorSpec spec;
  spec.set_name(absl::StrCat("input", index));
  spec.set_dtype(v1::FLOAT32);
  if (!input.isTensor() || input.toTensor().dim() == 0) {
    spec.add_dims(kBatchDim);
    return spec;
  }
  const torch::Tensor& t = input.toTensor();
  spec.set_dtype(worker::DTypeOf(t.scalar_type()).value_or(v1::FLOAT32));
  spec.add_dims(kBatchDim);
  for (int64_t d = 1; d < t.dim(); ++d) spec.add_dims(t.size(d));
  if (spec.dtype() != v1::BOOL && !t.is_floating_point() && t.numel() > 0) {
    spec.mutable_range()->set_low(t.min().item<double>());
    spec.mutable_range()->set_high(t.max().item<double>() + 1);
  }
  return spec;
}

std::string DimsText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// The step a call makes, against the step the schedule was planned for:
// each input's dtype and shape as `planned` gives them at `batch_size`.
// A schedule's peak is the planned step's: at another batch or shape its
// budget says nothing, so a mismatch is refused rather than run.
absl::Status CheckPlannedInputs(const std::vector<v1::TensorSpec>& planned,
                                int64_t batch_size,
                                const std::vector<torch::IValue>& inputs) {
  auto planned_text = [&]() {
    std::vector<std::string> texts;
    texts.reserve(planned.size());
    for (const v1::TensorSpec& spec : planned) {
      texts.push_back(FormatTensorSpec(spec));
    }
    return absl::StrJoin(texts, " ");
  };
  if (inputs.size() != planned.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs.size(), " inputs given; the schedule was planned for ",
        planned.size(), " at batch ", batch_size, ": ", planned_text()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const v1::TensorSpec& spec = planned[i];
    const std::vector<int64_t> want = ConcreteDims(spec, batch_size);
    const std::string want_text =
        absl::StrCat(DTypeName(spec.dtype()), DimsText(want));
    const std::string which =
        absl::StrCat("input ", i, " (\"", spec.name(), "\")");
    if (!inputs[i].isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " is a ", inputs[i].tagKind(),
                       ", the schedule was planned for a tensor ", want_text));
    }
    const torch::Tensor& t = inputs[i].toTensor();
    const std::optional<v1::DType> dtype = worker::DTypeOf(t.scalar_type());
    const std::vector<int64_t> got(t.sizes().begin(), t.sizes().end());
    const std::string got_text = absl::StrCat(
        dtype.has_value() ? DTypeName(*dtype)
                          : std::string(c10::toString(t.scalar_type())),
        DimsText(got));
    if (got_text == want_text) continue;
    std::string hint;
    const bool only_batch =
        got.size() == want.size() && !got.empty() && dtype == spec.dtype() &&
        std::equal(got.begin() + 1, got.end(), want.begin() + 1) &&
        !spec.dims().empty() && spec.dims(0) == kBatchDim;
    if (only_batch) {
      hint = absl::StrCat(
          ": batch ", got[0], " is not the planned batch ", batch_size,
          ", and the schedule's budget holds only for the step it was "
          "planned for; plan one at batch ",
          got[0], " (mutwo submit/plan) or pass batches of ", batch_size);
    } else {
      hint =
          ": the schedule's budget holds only for the step it was planned "
          "for; plan one for these inputs";
    }
    return absl::InvalidArgumentError(
        absl::StrCat(which, " is ", got_text, ", the schedule was planned for ",
                     want_text, " (batch ", batch_size, ")", hint));
  }
  return absl::OkStatus();
}

}  // namespace

struct ScheduledStep::Impl {
  v1::Schedule schedule;
  torch::jit::Module model;  // the caller's (a handle)
  ScheduledStepOptions options;
  // Made at the first Run: the IR is specialised to the control flow the
  // step takes (worker/specialize.h) on inputs shaped as the caller's, as
  // the profile's were by its input specs.
  std::unique_ptr<worker::Executor> executor;
  // The step every Run must make: the schedule's recorded inputs (forward's
  // order, arguments left out omitted) at its batch size; for a schedule
  // that records none, the first Run's inputs (the executor's IR is
  // specialised to them).
  std::vector<v1::TensorSpec> planned_inputs;
  int64_t planned_batch = 0;
  // Runs that completed; the second one's peak (measured_peak_bytes()).
  int runs = 0;
  int64_t measured_peak = 0;
};

ScheduledStep::ScheduledStep(const torch::jit::Module& model,
                             const ScheduleJson& schedule,
                             ScheduledStepOptions options)
    : impl_(std::make_unique<Impl>()) {
  ThrowIfError(ProtoFromJson(schedule.text, "schedule", &impl_->schedule),
               "reading the schedule");
  const v1::Schedule& s = impl_->schedule;
  if (options.require_feasible && !s.feasible()) {
    throw std::runtime_error(absl::StrCat(
        "mutwo: the schedule is infeasible (budget ", s.budget_bytes(),
        " B, floor ", s.floor_bytes(), " B): ", s.reason(),
        "; set require_feasible = false to run it anyway"));
  }
  if (model.get_method("forward").function().getSchema().arguments().size() <
      2) {
    throw std::runtime_error("mutwo: the module's forward takes no input");
  }
  impl_->model = model;
  impl_->options = std::move(options);
  impl_->planned_inputs.assign(s.inputs().begin(), s.inputs().end());
  impl_->planned_batch = s.batch_size();
}

ScheduledStep::~ScheduledStep() = default;

torch::Tensor ScheduledStep::Run(
    const std::vector<torch::IValue>& inputs,
    const std::function<torch::Tensor(const torch::IValue&)>& loss) {
  if (impl_->planned_inputs.empty()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      impl_->planned_inputs.push_back(SpecOf(inputs[i], i));
    }
  }
  if (impl_->planned_batch <= 0) {
    impl_->planned_batch = !inputs.empty() && inputs[0].isTensor() &&
                                   inputs[0].toTensor().dim() > 0
                               ? inputs[0].toTensor().size(0)
                               : 1;
  }
  ThrowIfError(
      CheckPlannedInputs(impl_->planned_inputs, impl_->planned_batch, inputs),
      "the step's inputs");
  if (impl_->executor == nullptr) {
    const v1::Schedule& s = impl_->schedule;
    worker::ExecutorOptions o;
    o.model_name = "the training loop's module";
    o.device = impl_->options.device;
    o.batch_size = impl_->planned_batch;
    for (size_t i = 0; i < inputs.size(); ++i) {
      o.inputs.push_back(SpecOf(inputs[i], i));
    }
    // Over the caller's module itself: no second copy is loaded.
    auto executor = worker::Executor::Create(std::move(o), &impl_->model);
    ThrowIfError(executor.status(), "loading the module");
    ThrowIfError((*executor)->PrepareUserStep(s), "applying the schedule");
    impl_->executor = *std::move(executor);
  }
  // The second Run is measured: the first runs before the caller's
  // optimizer has made its state.
  const bool measure = impl_->runs == 1;
  int64_t peak = 0;
  absl::StatusOr<torch::Tensor> out =
      impl_->executor->UserStep(inputs, loss, measure ? &peak : nullptr);
  ThrowIfError(out.status(), "training step");
  ++impl_->runs;
  if (measure) {
    impl_->measured_peak = peak;
    if (over_budget()) {
      const v1::Schedule& s = impl_->schedule;
      spdlog::warn(
          "mutwo::ScheduledStep: the second step peaked at {} (forward, "
          "loss and backward), over the schedule's budget {} (predicted "
          "peak {}): the budget does not hold in this loop",
          FormatBytes(peak), FormatBytes(s.budget_bytes()),
          FormatBytes(s.predicted_peak_bytes()));
    }
  }
  return *std::move(out);
}

int64_t ScheduledStep::measured_peak_bytes() const {
  return impl_->measured_peak;
}

bool ScheduledStep::over_budget() const {
  const int64_t budget = impl_->schedule.budget_bytes();
  return impl_->measured_peak > 0 && budget > 0 &&
         impl_->measured_peak > budget;
}

int ScheduledStep::recomputed() const {
  int n = 0;
  for (const v1::Decision& d : impl_->schedule.decisions()) {
    n += d.action() == v1::Decision::RECOMPUTE;
  }
  return n;
}

int ScheduledStep::swapped() const {
  int n = 0;
  for (const v1::Decision& d : impl_->schedule.decisions()) {
    n += d.action() == v1::Decision::SWAP;
  }
  return n;
}

const std::string& ScheduledStep::graph_fingerprint() const {
  return impl_->executor != nullptr ? impl_->executor->graph_fingerprint()
                                    : impl_->schedule.graph_fingerprint();
}

}  // namespace mutwo
