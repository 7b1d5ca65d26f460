#include "server/max_batch_plans.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "planner/plan_request.h"
#include "planner/proto_convert.h"
#include "server/max_batch_check.h"

namespace mutwo {

int64_t CapacityBytes(const v1::JobSpec& spec, const v1::DeviceInfo& device) {
  if (spec.capacity().kind_case() == v1::MemoryBudget::kBytes) {
    return spec.capacity().bytes();
  }
  if (spec.capacity().kind_case() == v1::MemoryBudget::kFractionOfDevice) {
    return static_cast<int64_t>(spec.capacity().fraction_of_device() *
                                static_cast<double>(device.total_bytes()));
  }
  return 0;
}

absl::StatusOr<v1::Schedule> MaxBatchSchedule(
    const std::vector<v1::Profile>& profiles, int64_t batch_size,
    int64_t capacity_bytes, v1::Policy policy, int64_t margin_bytes) {
  planner::ScheduleRequest request;
  request.correction_bytes = policy == v1::NONE ? 0 : margin_bytes;
  request.budget.set_bytes(capacity_bytes);
  request.budget.set_text(
      absl::StrCat("max batch capacity ", FormatBytes(capacity_bytes)));
  request.policy = policy;
  request.max_timeline_samples = 0;
  return planner::PlanScheduleAtBatch(profiles, batch_size, request);
}

int64_t FragmentationMarginBytes(const v1::MaxBatchPrediction& m) {
  const int64_t usable = m.capacity_bytes() - m.reserve_bytes();
  if (usable <= 0 || m.fragmentation_fraction() <= 0) return 0;
  return usable -
         static_cast<int64_t>(std::floor(static_cast<double>(usable) /
                                         (1 + m.fragmentation_fraction())));
}

std::vector<v1::Schedule> PrepareMaxBatchChecks(
    const v1::JobSpec& spec, const std::vector<v1::Profile>& profiles,
    v1::MaxBatchPrediction& m) {
  const int64_t capacity = m.capacity_bytes();
  const std::string why = WhyNotVerified(spec, profiles.front().device());
  const int64_t margin = FragmentationMarginBytes(m);
  std::vector<v1::Schedule> out;
  auto prepare = [&](int64_t batch, v1::Policy policy, v1::MaxBatchCheck* c) {
    if (batch <= 0) {
      *c = UnverifiedCheck(batch, capacity,
                           "nothing to run: not even batch size 1 is "
                           "predicted to fit");
      return;
    }
    if (!why.empty()) {
      *c = UnverifiedCheck(batch, capacity, why);
      return;
    }
    auto schedule = MaxBatchSchedule(profiles, batch, capacity, policy, margin);
    if (!schedule.ok() || (policy != v1::NONE && !schedule->feasible())) {
      *c = UnverifiedCheck(
          batch, capacity,
          absl::StrCat("planning batch ", batch, " for the capacity: ",
                       schedule.ok() ? schedule->reason()
                                     : schedule.status().message()));
      return;
    }
    *c = QueuedCheck(batch, capacity);
    out.push_back(*std::move(schedule));
  };
  prepare(m.max_batch_without_checkpointing(), v1::NONE,
          m.mutable_without_checkpointing_check());
  if (m.max_batch_with_schedule() != m.max_batch_without_checkpointing()) {
    prepare(m.max_batch_with_schedule(), v1::MUTWO,
            m.mutable_with_schedule_check());
  }
  return out;
}

bool OtherProfilePending(const std::vector<v1::Task>& tasks,
                         const v1::Task& task) {
  return std::any_of(tasks.begin(), tasks.end(), [&](const v1::Task& t) {
    return t.kind() == v1::Task::PROFILE && t.task_id() != task.task_id() &&
           (t.state() == v1::Task::QUEUED || t.state() == v1::Task::LEASED);
  });
}

void DeferMaxBatchChecks(v1::MaxBatchPrediction& m) {
  for (v1::MaxBatchCheck* c : {m.mutable_without_checkpointing_check(),
                               m.mutable_with_schedule_check()}) {
    if (c->state() == v1::MaxBatchCheck::VERIFYING) {
      c->set_state(v1::MaxBatchCheck::NOT_VERIFIED);
      c->set_reason("run once every batch size is profiled");
    }
  }
}

std::vector<int64_t> DoneProfileBatches(const std::vector<v1::Task>& tasks,
                                        const std::string& skip_task_id) {
  std::vector<int64_t> out;
  for (const v1::Task& t : tasks) {
    if (t.kind() == v1::Task::PROFILE && t.state() == v1::Task::DONE &&
        t.task_id() != skip_task_id) {
      out.push_back(t.batch_size());
    }
  }
  return out;
}

std::vector<v1::Profile> UsableProfiles(
    storage::Store& store, const std::string& job_id,
    const std::vector<int64_t>& batch_sizes) {
  std::vector<v1::Profile> out;
  for (int64_t b : batch_sizes) {
    auto p = store.GetProfile(job_id, b);
    if (p.ok() && !p->oom()) out.push_back(*std::move(p));
  }
  return out;
}

}  // namespace mutwo
