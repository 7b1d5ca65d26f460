// include/mutwo/scheduled_step.h over the executor (worker/executor.h): the
// caller's module is saved to bytes, from which the executor builds the same
// IR as the profiler did (the fingerprint the schedule names), then runs the
// caller's own module object with the caller's inputs and loss.
#include "mutwo/scheduled_step.h"

#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "mutwo/v1/types.pb.h"
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

}  // namespace

struct ScheduledStep::Impl {
  v1::Schedule schedule;
  torch::jit::Module model;  // the caller's (a handle)
  ScheduledStepOptions options;
  // Made at the first Run: the IR is specialised to the control flow the
  // step takes (worker/specialize.h) on inputs shaped as the caller's, as
  // the profile's were by its input specs.
  std::unique_ptr<worker::Executor> executor;
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
}

ScheduledStep::~ScheduledStep() = default;

torch::Tensor ScheduledStep::Run(
    const std::vector<torch::IValue>& inputs,
    const std::function<torch::Tensor(const torch::IValue&)>& loss) {
  if (impl_->executor == nullptr) {
    const v1::Schedule& s = impl_->schedule;
    worker::ExecutorOptions o;
    o.model_name = "the training loop's module";
    o.device = impl_->options.device;
    o.batch_size = s.batch_size();
    if (o.batch_size <= 0) {
      o.batch_size = !inputs.empty() && inputs[0].isTensor() &&
                             inputs[0].toTensor().dim() > 0
                         ? inputs[0].toTensor().size(0)
                         : 1;
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      o.inputs.push_back(SpecOf(inputs[i], i));
    }
    // Over the caller's module itself: no second copy is loaded.
    auto executor = worker::Executor::Create(std::move(o), &impl_->model);
    ThrowIfError(executor.status(), "loading the module");
    ThrowIfError((*executor)->PrepareUserStep(s), "applying the schedule");
    impl_->executor = *std::move(executor);
  }
  absl::StatusOr<torch::Tensor> out = impl_->executor->UserStep(inputs, loss);
  ThrowIfError(out.status(), "training step");
  return *std::move(out);
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
