// JobCore's planning: schedules planned through the schedule cache (for
// GetSchedule and for what a report needs), and the real planner behind
// PlanFn and MaxBatchFn.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "planner/interrupt.h"
#include "planner/plan_request.h"
#include "planner/proto_convert.h"
#include "server/job_core.h"
#include "server/job_rules.h"

namespace mutwo {
namespace {

double ElapsedSeconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

PlanFn PlannerPlanFn(int pareto_points) {
  return
      [pareto_points](const v1::Profile& profile, const PlanRequest& request) {
        planner::ScheduleRequest r;
        r.budget = request.budget;
        r.policy = request.policy;
        r.pareto_points = request.include_pareto ? pareto_points : 0;
        r.correction_bytes = request.correction_bytes;
        r.interrupt = request.interrupt;
        return planner::PlanSchedule(profile, r);
      };
}

MaxBatchFn PlannerMaxBatchFn() {
  return [](const std::vector<v1::Profile>& profiles, int64_t capacity_bytes,
            double max_overhead) {
    return planner::PredictMaxBatchProto(profiles, capacity_bytes,
                                         max_overhead);
  };
}

absl::StatusOr<v1::Schedule> JobCore::Plan(
    const v1::Profile& profile, const v1::MemoryBudget& budget,
    v1::Policy policy, int64_t correction_bytes,
    const std::function<bool()>& cancelled, absl::Time deadline) {
  if (profile.oom()) {
    return absl::FailedPreconditionError(
        absl::StrCat("batch size ", profile.batch_size(),
                     " ran out of memory while profiling (", profile.oom_step(),
                     "); no schedule can be planned from it"));
  }
  PlanRequest request;
  request.budget = budget;
  request.policy = policy;
  // Cached schedules always carry the Pareto curve so that one entry serves
  // requests with and without it.
  request.include_pareto = true;
  request.correction_bytes = correction_bytes;
  planner::Interrupt interrupt(
      std::min(deadline,
               absl::Now() + absl::Milliseconds(options_.max_plan_ms)),
      cancelled);
  request.interrupt = &interrupt;
  const auto start = std::chrono::steady_clock::now();
  auto schedule = plan_(profile, request);
  metrics_->ObservePlanner(ElapsedSeconds(start));
  return schedule;
}

storage::ScheduleCacheKey JobCore::OwnKey(const v1::JobSpec& spec,
                                          int64_t batch_size,
                                          const v1::DeviceInfo& device,
                                          const v1::MemoryBudget& budget,
                                          v1::Policy policy,
                                          const CacheOwner& owner) {
  storage::ScheduleCacheKey key = storage::MakeScheduleCacheKey(
      spec, batch_size, device, budget, policy, owner.tenant);
  key.profile_sha256 = owner.profile_sha256;
  key.measured_by = owner.measured_by;
  return key;
}

absl::StatusOr<v1::Schedule> JobCore::PlanCached(
    const v1::JobSpec& spec, const std::string& job_id, const CacheOwner& owner,
    int64_t batch_size, const v1::DeviceInfo& device,
    const std::function<absl::StatusOr<v1::Profile>()>& load_profile,
    const v1::MemoryBudget& budget, v1::Policy policy, bool include_pareto,
    bool include_timeline, std::vector<CachePut>* deferred,
    const std::function<bool()>& cancelled, absl::Time deadline) {
  const storage::ScheduleCacheKey key =
      OwnKey(spec, batch_size, device, budget, policy, owner);
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> cached,
                         cache_.Get(key, include_pareto, include_timeline));
  if (cached.has_value()) return *std::move(cached);
  auto put = [&](const storage::ScheduleCacheKey& k,
                 const v1::Schedule& schedule) -> absl::Status {
    if (deferred != nullptr) {
      deferred->push_back(CachePut{k, job_id, schedule});
      return absl::OkStatus();
    }
    return cache_.Put(k, job_id, schedule);
  };
  storage::ScheduleCacheKey shared_key = key;
  shared_key.shared = true;
  if (owner.use_shared) {
    MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> trusted,
                           cache_.Peek(shared_key));
    if (trusted.has_value()) {
      metrics_->CountSharedCacheHit();
      MUTWO_RETURN_IF_ERROR(put(key, *trusted));
      return ScheduleCache::Trim(*std::move(trusted), include_pareto,
                                 include_timeline);
    }
  }
  // Only a miss needs the whole profile.
  MUTWO_ASSIGN_OR_RETURN(v1::Profile profile, load_profile());
  MUTWO_ASSIGN_OR_RETURN(v1::Schedule schedule,
                         Plan(profile, budget, policy, /*correction_bytes=*/0,
                              cancelled, deadline));
  MUTWO_RETURN_IF_ERROR(put(key, schedule));
  if (owner.share) MUTWO_RETURN_IF_ERROR(put(shared_key, schedule));
  return ScheduleCache::Trim(std::move(schedule), include_pareto,
                             include_timeline);
}

absl::StatusOr<std::shared_ptr<const v1::Job>> JobCore::JobFactsOf(
    const std::string& job_id) {
  {
    absl::MutexLock lock(&hot_mu_);
    auto it = hot_jobs_.find(job_id);
    if (it != hot_jobs_.end()) return it->second;
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(job_id));
  // A job's spec and owner never change after SubmitJob, so they can be
  // kept.
  auto facts = std::make_shared<v1::Job>();
  *facts->mutable_spec() = job.spec();
  facts->set_owner(job.owner());
  absl::MutexLock lock(&hot_mu_);
  if (hot_jobs_.size() >= kHotCacheEntries) hot_jobs_.clear();
  hot_jobs_[job_id] = facts;
  return facts;
}

absl::StatusOr<std::shared_ptr<const v1::DeviceInfo>> JobCore::ProfileDeviceOf(
    const std::string& job_id, int64_t batch_size) {
  const std::string key = absl::StrCat(job_id, "/", batch_size);
  {
    absl::MutexLock lock(&hot_mu_);
    auto it = hot_devices_.find(key);
    if (it != hot_devices_.end()) return it->second;
  }
  auto device = store_->GetProfileDevice(job_id, batch_size);
  if (absl::IsNotFound(device.status())) {
    return absl::NotFoundError(absl::StrCat("job ", job_id,
                                            " has no profile for batch size ",
                                            batch_size, " (yet)"));
  }
  MUTWO_RETURN_IF_ERROR(device.status());
  // Only one profile is ever stored per (job, batch): the first completed
  // report wins (fencing), so its device can be kept.
  auto shared = std::make_shared<const v1::DeviceInfo>(*std::move(device));
  absl::MutexLock lock(&hot_mu_);
  if (hot_devices_.size() >= kHotCacheEntries) hot_devices_.clear();
  hot_devices_[key] = shared;
  return shared;
}

absl::StatusOr<std::shared_ptr<const JobCore::CacheOwner>>
JobCore::ProfileOwnerOf(const std::string& job_id, const std::string& tenant,
                        int64_t batch_size) {
  const std::string key = absl::StrCat(job_id, "/", batch_size);
  {
    absl::MutexLock lock(&hot_mu_);
    auto it = hot_owners_.find(key);
    if (it != hot_owners_.end()) return it->second;
  }
  auto owner = std::make_shared<CacheOwner>();
  owner->tenant = tenant;
  MUTWO_ASSIGN_OR_RETURN(std::optional<storage::ProfileMeasurement> measurement,
                         store_->GetProfileMeasurement(job_id, batch_size));
  if (measurement.has_value()) {
    owner->profile_sha256 = measurement->profile_sha256;
    owner->measured_by = absl::StrCat(measurement->worker_principal, "/",
                                      measurement->worker_id);
  } else {
    // Stored before measurements were kept (schema version 4): bound to
    // its own digest all the same.
    auto profile = store_->GetProfile(job_id, batch_size);
    if (absl::IsNotFound(profile.status())) {
      return absl::NotFoundError(absl::StrCat("job ", job_id,
                                              " has no profile for batch size ",
                                              batch_size, " (yet)"));
    }
    MUTWO_RETURN_IF_ERROR(profile.status());
    owner->profile_sha256 = ProfileDigest(*profile);
  }
  // One profile per (job, batch), the first completed report's: its
  // owner never changes.
  absl::MutexLock lock(&hot_mu_);
  if (hot_owners_.size() >= kHotCacheEntries) hot_owners_.clear();
  hot_owners_[key] = owner;
  return std::shared_ptr<const CacheOwner>(owner);
}

absl::StatusOr<v1::Schedule> JobCore::GetSchedule(
    const v1::GetScheduleRequest& request, std::function<bool()> cancelled) {
  if (request.budget().kind_case() == v1::MemoryBudget::KIND_NOT_SET) {
    return absl::InvalidArgumentError(
        "GetSchedule needs a budget (bytes, fraction of baseline or device)");
  }
  MUTWO_RETURN_IF_ERROR(ValidateBudget(request.budget()));
  MUTWO_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Job> job,
                         JobFactsOf(request.job_id()));
  MUTWO_ASSIGN_OR_RETURN(
      std::shared_ptr<const v1::DeviceInfo> device,
      ProfileDeviceOf(request.job_id(), request.batch_size()));
  MUTWO_ASSIGN_OR_RETURN(
      std::shared_ptr<const CacheOwner> owner,
      ProfileOwnerOf(request.job_id(), job->owner(), request.batch_size()));
  const v1::Policy policy =
      request.policy() == v1::POLICY_UNSPECIFIED ? v1::MUTWO : request.policy();
  return PlanCached(
      job->spec(), request.job_id(), *owner, request.batch_size(), *device,
      [&] {
        return store_->GetProfile(request.job_id(), request.batch_size());
      },
      request.budget(), policy, request.include_pareto(),
      request.include_timeline(), /*deferred=*/nullptr, cancelled);
}

void JobCore::ApplyCachePuts(const std::vector<CachePut>& puts) {
  for (const CachePut& put : puts) {
    if (absl::Status s = cache_.Put(put.key, put.job_id, put.schedule);
        !s.ok()) {
      // The cache is derived data: a later request plans again.
      MUTWO_LOG(warn, "schedule cache: {}", s.ToString());
    }
  }
}

}  // namespace mutwo
