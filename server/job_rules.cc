#include "server/job_rules.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/status_macros.h"

namespace mutwo {

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

absl::Status ValidateSpec(const v1::JobSpec& spec) {
  std::vector<v1::TensorSpec> inputs(spec.inputs().begin(),
                                     spec.inputs().end());
  MUTWO_RETURN_IF_ERROR(ValidateInputs(inputs));
  if (spec.batch_sizes().empty()) {
    return absl::InvalidArgumentError("no batch sizes: give at least one");
  }
  if (spec.batch_sizes_size() > 64) {
    return absl::InvalidArgumentError("at most 64 batch sizes per job");
  }
  for (int64_t b : spec.batch_sizes()) {
    if (b <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch size ", b, " must be positive"));
    }
  }
  if (spec.budgets_size() > 32) {
    return absl::InvalidArgumentError("at most 32 budgets per job");
  }
  for (const auto& b : spec.budgets()) MUTWO_RETURN_IF_ERROR(ValidateBudget(b));
  if (absl::Status loss = ValidateLossSpec(spec.loss()); !loss.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss \"", FormatLossSpec(spec.loss()), "\": ", loss.message()));
  }
  if (spec.has_capacity()) {
    const v1::MemoryBudget& c = spec.capacity();
    if (c.kind_case() != v1::MemoryBudget::kBytes &&
        c.kind_case() != v1::MemoryBudget::kFractionOfDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capacity \"", FormatBudget(c),
          "\": give bytes (80GiB) or a fraction of the device (95%dev)"));
    }
    MUTWO_RETURN_IF_ERROR(ValidateBudget(c));
  }
  if (spec.max_overhead() < 0 || spec.max_overhead() > 10) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_overhead ", spec.max_overhead(), " must be in [0, 10]"));
  }
  if (!spec.device_kind().empty() && spec.device_kind() != "cpu" &&
      spec.device_kind() != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_kind \"", spec.device_kind(), "\": use cpu, cuda or empty"));
  }
  return absl::OkStatus();
}

v1::BatchResult* FindOrAddResult(v1::Job& job, int64_t batch_size) {
  for (auto& r : *job.mutable_results()) {
    if (r.batch_size() == batch_size) return &r;
  }
  auto* r = job.add_results();
  r->set_batch_size(batch_size);
  // Keep results ordered by batch size.
  std::sort(job.mutable_results()->begin(), job.mutable_results()->end(),
            [](const v1::BatchResult& a, const v1::BatchResult& b) {
              return a.batch_size() < b.batch_size();
            });
  for (auto& res : *job.mutable_results()) {
    if (res.batch_size() == batch_size) return &res;
  }
  return r;
}

}  // namespace mutwo
