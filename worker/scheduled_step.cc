// include/mutwo/scheduled_step.h over the executor (worker/executor.h): the
// caller's module is saved to bytes, from which the executor builds the same
// IR as the profiler did (the fingerprint the schedule names), then runs the
// caller's own module object with the caller's inputs and loss.
#include "mutwo/scheduled_step.h"

#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "mutwo/v1/types.pb.h"
#include "worker/executor.h"

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

struct ScheduledStep::Impl {
  v1::Schedule schedule;
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
  worker::ExecutorOptions o;
  std::ostringstream bytes;
  model.save(bytes);
  o.model_bytes = bytes.str();
  o.model_name = "the training loop's module";
  o.device = options.device;
  o.batch_size = s.batch_size() > 0 ? s.batch_size() : 1;
  // The executor checks forward's arity against input specs; the caller's
  // tensors replace the generated inputs at every step.
  const size_t arity =
      model.get_method("forward").function().getSchema().arguments().size();
  for (size_t i = 1; i < arity; ++i) {
    v1::TensorSpec spec;
    spec.set_name(absl::StrCat("input", i - 1));
    spec.set_dtype(v1::FLOAT32);
    spec.add_dims(kBatchDim);
    o.inputs.push_back(spec);
  }
  if (o.inputs.empty()) {
    throw std::runtime_error("mutwo: the module's forward takes no input");
  }
  auto executor = worker::Executor::Create(std::move(o));
  ThrowIfError(executor.status(), "loading the module");
  impl_->executor = *std::move(executor);
  ThrowIfError(impl_->executor->PrepareUserStep(s, model),
               "applying the schedule");
}

ScheduledStep::~ScheduledStep() = default;

torch::Tensor ScheduledStep::Run(
    const std::vector<torch::IValue>& inputs,
    const std::function<torch::Tensor(const torch::IValue&)>& loss) {
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
  return impl_->executor->graph_fingerprint();
}

}  // namespace mutwo
