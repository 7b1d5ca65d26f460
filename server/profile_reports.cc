// JobCore's profile reports: a PROFILE task's profile checked, planned (the
// memory question, every budget of the job, the max batch prediction over
// every profile) and stored with the VALIDATE and MAX_BATCH tasks it
// queues, in one transaction.
#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "planner/plan_request.h"
#include "planner/proto_convert.h"
#include "server/closed_loop.h"
#include "server/job_core.h"
#include "server/job_rules.h"
#include "server/max_batch_plans.h"

namespace mutwo {
namespace {

// The max batch prediction a profile report stores, over every usable
// profile of the job with the reported one, and the MAX_BATCH tasks it
// queues when the report is the job's last profile.
struct MaxBatchPlan {
  // Batch sizes of the other DONE profiles it was predicted from: checked
  // again inside the report's transaction.
  std::vector<int64_t> used;
  std::optional<v1::MaxBatchPrediction> prediction;
  std::vector<v1::Schedule> to_verify;
};

absl::StatusOr<MaxBatchPlan> PredictMaxBatch(storage::Store& store,
                                             const MaxBatchFn& max_batch,
                                             const v1::Job& job,
                                             const v1::Task& task,
                                             const v1::Profile& profile) {
  MaxBatchPlan plan;
  MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> tasks,
                         store.ListTasks(task.job_id()));
  plan.used = DoneProfileBatches(tasks, task.task_id());
  std::vector<v1::Profile> profiles =
      UsableProfiles(store, task.job_id(), plan.used);
  if (!profile.oom()) profiles.push_back(profile);
  if (profiles.size() < 2) return plan;
  const double overhead =
      job.spec().max_overhead() > 0 ? job.spec().max_overhead() : 0.25;
  auto prediction = max_batch(
      profiles, CapacityBytes(job.spec(), profile.device()), overhead);
  if (!prediction.ok()) {
    MUTWO_LOG(warn, "job {}: max batch: {}", job.job_id(),
              prediction.status().ToString());
    return plan;
  }
  plan.prediction = *std::move(prediction);
  plan.to_verify =
      PrepareMaxBatchChecks(job.spec(), profiles, *plan.prediction);
  return plan;
}

// A plan's error as the report's result shows it: past the report's
// deadline, the limit that cut it.
std::string CutReason(const absl::Status& status, absl::Time deadline) {
  if (absl::Now() >= deadline) {
    return absl::StrCat(
        "cut: the report's planning passed its time limit "
        "(--max_report_plan_ms) before this plan was done (",
        status.message(), ")");
  }
  return std::string(status.message());
}

}  // namespace

absl::Status JobCore::CheckProfileReport(const v1::Task& task,
                                         const v1::Profile& profile) {
  if (task.kind() != v1::Task::PROFILE) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", task.task_id(), " is not a PROFILE task"));
  }
  if (profile.batch_size() != task.batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile is for batch size ", profile.batch_size(), " but task ",
        task.task_id(), " is for ", task.batch_size()));
  }
  // Refused before anything is stored or planned: larger than this server
  // plans, or what the planner would refuse later, named by field.
  std::string limit;
  if (absl::Status s =
          CheckProfileSize(profile, options_.profile_limits, &limit);
      !s.ok()) {
    metrics_->CountLimitRefusal(limit);
    return s;
  }
  return planner::ValidateProfile(profile);
}

absl::StatusOr<ProfileTrust> JobCore::JudgeReport(const v1::Job& job,
                                                  const v1::Task& task,
                                                  const std::string& worker_id,
                                                  const v1::Profile& profile) {
  storage::ProfileMeasurement mine;
  mine.job_id = task.job_id();
  mine.batch_size = task.batch_size();
  mine.measurement_key = storage::MeasurementKeyString(
      job.spec(), task.batch_size(), profile.device());
  mine.profile_sha256 = ProfileDigest(profile);
  mine.worker_id = worker_id;
  auto principal = store_->GetWorkerPrincipal(worker_id);
  if (principal.ok()) {
    mine.worker_principal = *std::move(principal);
  } else if (!absl::IsNotFound(principal.status())) {
    return principal.status();
  }
  mine.tenant = job.owner();
  mine.peak_bytes = profile.measured().peak_bytes();
  MUTWO_ASSIGN_OR_RETURN(std::vector<storage::ProfileMeasurement> others,
                         store_->ListProfileMeasurements(mine.measurement_key));
  return JudgeProfile(std::move(mine), others, options_.profile_trust);
}

absl::Status JobCore::AnswerMemory(const v1::Job& job, const CacheOwner& owner,
                                   int64_t batch_size,
                                   const v1::Profile& profile,
                                   v1::BatchResult& result,
                                   std::vector<CachePut>* cache_puts,
                                   const ReportBounds& bounds) {
  v1::MemoryBudget knee;
  knee.set_knee(true);
  knee.set_text("auto");
  MUTWO_ASSIGN_OR_RETURN(
      v1::Schedule at_knee,
      PlanCached(
          job.spec(), job.job_id(), owner, batch_size, profile.device(),
          [&]() -> absl::StatusOr<v1::Profile> { return profile; }, knee,
          v1::MUTWO, /*include_pareto=*/true, /*include_timeline=*/false,
          cache_puts, bounds.cancelled, bounds.deadline));
  result.set_floor_bytes(at_knee.floor_bytes());
  result.set_plan_baseline_iteration_ms(at_knee.baseline_iteration_ms());
  *result.mutable_pareto() = at_knee.pareto();
  v1::ParetoPoint& k = *result.mutable_knee();
  k.set_budget_bytes(at_knee.budget_bytes());
  k.set_predicted_peak_bytes(at_knee.predicted_peak_bytes());
  k.set_predicted_iteration_ms(at_knee.predicted_iteration_ms());
  k.set_recomputed(at_knee.recomputed());
  k.set_swapped(at_knee.swapped());
  return absl::OkStatus();
}

absl::Status JobCore::ShowPlanning(const v1::Job& job, const v1::Task& task) {
  // PLANNING while this batch size is planned, once no other profile is
  // pending (else the job stays PROFILING). A state shown, not a fact: the
  // report settles the job again.
  MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> tasks,
                         store_->ListTasks(task.job_id()));
  if (IsFinal(job.state()) || job.state() == v1::Job::PLANNING ||
      OtherProfilePending(tasks, task)) {
    return absl::OkStatus();
  }
  auto planning = store_->UpdateJob(task.job_id(), [&](v1::Job& j) {
    if (!IsFinal(j.state())) j.set_state(v1::Job::PLANNING);
    return absl::OkStatus();
  });
  if (planning.ok()) NotifyChange();
  return absl::OkStatus();
}

JobCore::ProfilePlans JobCore::PlanBatchResult(const v1::Job& job,
                                               const v1::Task& task,
                                               const v1::Profile& profile,
                                               ProfileTrust trust,
                                               const ReportBounds& bounds) {
  ProfilePlans plans;
  CacheOwner owner;
  owner.tenant = job.owner();
  owner.profile_sha256 = trust.measurement.profile_sha256;
  owner.measured_by = absl::StrCat(trust.measurement.worker_principal, "/",
                                   trust.measurement.worker_id);
  owner.use_shared = trust.use_shared;
  owner.share = trust.share;
  plans.trust = std::move(trust);
  v1::BatchResult& result = plans.result;
  result.set_batch_size(task.batch_size());
  result.set_baseline_peak_bytes(profile.measured().peak_bytes());
  // The step time the schedules' predicted times are scaled to.
  result.set_baseline_iteration_ms(profile.measured().iteration_ms() *
                                   planner::TimeScale(profile.measured()));
  if (profile.oom()) {
    result.set_oom(true);
    result.set_error(
        absl::StrCat("out of memory while profiling at ", profile.oom_step()));
    return plans;
  }
  if (IsFinal(job.state())) return plans;
  // The memory question first, whether or not budgets were given.
  if (absl::Status s = AnswerMemory(job, owner, task.batch_size(), profile,
                                    result, &plans.cache_puts, bounds);
      !s.ok()) {
    result.set_error(absl::StrCat("floor and Pareto curve: ",
                                  CutReason(s, bounds.deadline)));
  }
  // What the plans hold in memory until they are stored: the result's
  // schedules and the cache entries planned with them.
  auto held_bytes = [&plans] {
    int64_t bytes = static_cast<int64_t>(plans.result.SpaceUsedLong());
    for (const CachePut& put : plans.cache_puts) {
      bytes += static_cast<int64_t>(put.schedule.SpaceUsedLong());
    }
    return bytes;
  };
  // The job's results of other batch sizes, which GetJob answers with this
  // one's.
  int64_t other_results_bytes = 0;
  for (const v1::BatchResult& other : job.results()) {
    if (other.batch_size() != task.batch_size()) {
      other_results_bytes += other.ByteSizeLong();
    }
  }
  for (const v1::MemoryBudget& budget : job.spec().budgets()) {
    // Stopped (the worker left, the server drains): no next plan. A plan
    // builds its planner (the checkpointing seeds applied to the lineages)
    // before its first poll, 0.7-1.2 s at 16,384 dense nodes, so a drain
    // waited for one more of those.
    if (bounds.cancelled && bounds.cancelled()) break;
    // Held until the report is stored: the schedules in the result and
    // their cache entries. The next plan is taken to be as large as the
    // last one.
    const int64_t held = held_bytes();
    const int64_t next =
        result.schedules_size() > 0 ? held / result.schedules_size() : 0;
    if (bounds.working_bytes + held + next > bounds.max_plan_bytes) {
      result.set_error(absl::StrCat(
          "cut: the report's planning reached its memory limit "
          "(--max_report_plan_bytes, ",
          FormatBytes(bounds.max_plan_bytes), ") before budget ",
          FormatBudget(budget), ": ", result.schedules_size(),
          " schedules hold ", FormatBytes(held), ", the planner needs about ",
          FormatBytes(bounds.working_bytes), " and the next schedule ",
          FormatBytes(next)));
      break;
    }
    auto schedule = PlanCached(
        job.spec(), job.job_id(), owner, task.batch_size(), profile.device(),
        [&]() -> absl::StatusOr<v1::Profile> { return profile; }, budget,
        v1::MUTWO, /*include_pareto=*/false, /*include_timeline=*/false,
        &plans.cache_puts, bounds.cancelled, bounds.deadline);
    if (!schedule.ok()) {
      result.set_error(
          absl::StrCat("planning for budget ", FormatBudget(budget), ": ",
                       CutReason(schedule.status(), bounds.deadline)));
      break;
    }
    const int64_t job_bytes = other_results_bytes + result.ByteSizeLong() +
                              schedule->ByteSizeLong() +
                              PlannedOutcome(*schedule).ByteSizeLong();
    if (job_bytes > options_.max_job_result_bytes) {
      result.set_error(absl::StrCat(
          "cut: the job's results reached their size limit "
          "(--max_job_result_bytes, ",
          FormatBytes(options_.max_job_result_bytes), ") at budget ",
          FormatBudget(budget), ": with its schedule they would take ",
          FormatBytes(job_bytes)));
      break;
    }
    // Feasible is a prediction: only a validation round makes it fit.
    *result.add_outcomes() = PlannedOutcome(*schedule);
    *result.add_schedules() = *std::move(schedule);
  }
  return plans;
}

absl::Status JobCore::ReportProfile(const v1::ReportProfileRequest& request,
                                    const std::function<bool()>& cancelled) {
  const ReportKey key = ReportKey::Of(request);
  MUTWO_ASSIGN_OR_RETURN(v1::Task task, store_->GetTask(request.task_id()));
  const v1::Profile& profile = request.profile();
  if (absl::Status s = CheckProfileReport(task, profile); !s.ok()) {
    return RefuseReport(task, key, std::move(s));
  }
  MUTWO_ASSIGN_OR_RETURN(TaskReports::Admission admission,
                         reports_.Admit(task, key));
  if (admission == TaskReports::Admission::kRetried) return absl::OkStatus();
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task.job_id()));
  MUTWO_RETURN_IF_ERROR(ShowPlanning(job, task));
  MUTWO_ASSIGN_OR_RETURN(ProfileTrust trust,
                         JudgeReport(job, task, request.worker_id(), profile));
  // Everything that takes time (planning, the max batch prediction) is done
  // before the transaction; the transaction stores it all or nothing.
  ReportBounds bounds;
  bounds.deadline =
      absl::Now() + absl::Milliseconds(options_.max_report_plan_ms);
  bounds.cancelled = cancelled;
  bounds.max_plan_bytes = options_.profile_limits.max_report_plan_bytes;
  bounds.working_bytes = PlanningWorkingBytes(profile);
  const auto start = std::chrono::steady_clock::now();
  ProfilePlans plans =
      PlanBatchResult(job, task, profile, std::move(trust), bounds);
  if (cancelled && cancelled()) {
    // Nothing stored: the task stays leased and is reported again (or
    // leased again when its lease expires). The job no longer shows
    // PLANNING for it.
    if (absl::Status s = Settle(task.job_id()); !s.ok()) {
      MUTWO_LOG(warn, "job {}: {}", task.job_id(), s.ToString());
    }
    return absl::CancelledError(absl::StrCat(
        "planning of the profile report for task ", task.task_id(),
        " stopped after ",
        std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start)
            .count(),
        " ms: the worker's call ended or the server is shutting down; "
        "nothing was stored"));
  }
  bool retried = false;
  MUTWO_RETURN_IF_ERROR(
      StoreProfileReport(key, task, profile, plans, job, &retried));
  if (retried) return absl::OkStatus();
  const storage::ProfileMeasurement& stored = plans.trust.measurement;
  if (!stored.flag.empty()) {
    metrics_->CountProfileDisagreement();
    MUTWO_LOG(warn,
              "job {} batch {}: profile flagged, its schedules are not "
              "shared across tenants: {}",
              task.job_id(), task.batch_size(), stored.flag);
  } else if (plans.trust.share) {
    MUTWO_LOG(info,
              "job {} batch {}: profile trusted ({}), its schedules are "
              "shared across tenants",
              task.job_id(), task.batch_size(), plans.trust.trusted_because);
  }
  FinishReport(job, plans.cache_puts);
  return absl::OkStatus();
}

absl::Status JobCore::StoreProfileReport(const ReportKey& key,
                                         const v1::Task& task,
                                         const v1::Profile& profile,
                                         ProfilePlans& plans, v1::Job& job,
                                         bool* retried) {
  // The max batch size from every usable profile of the job with this one.
  // The profiles used are checked again inside the transaction: a profile
  // another report stored meanwhile means predicting again.
  constexpr int kMaxPredictions = 4;
  for (int prediction_round = 1;; ++prediction_round) {
    MUTWO_ASSIGN_OR_RETURN(
        MaxBatchPlan max_batch,
        PredictMaxBatch(*store_, max_batch_, job, task, profile));
    absl::Status written = reports_.Write(
        key, profile.SerializeAsString(), retried,
        [&](storage::Store::Writer& w) -> absl::Status {
          MUTWO_RETURN_IF_ERROR(
              w.PutProfile(task.job_id(), task.batch_size(), profile));
          // Judged again with the write lock held: a report of the same key
          // stored since the first judgement may disagree with this one.
          MUTWO_ASSIGN_OR_RETURN(
              std::vector<storage::ProfileMeasurement> others,
              w.ListProfileMeasurements(
                  plans.trust.measurement.measurement_key));
          ProfileTrust now = JudgeProfile(plans.trust.measurement, others,
                                          options_.profile_trust);
          MUTWO_RETURN_IF_ERROR(w.PutProfileMeasurement(now.measurement));
          if (!now.share || !now.use_shared) {
            // Judged trusted before the transaction but not inside it: the
            // job keeps its own entries, nothing is shared.
            std::vector<CachePut>& puts = plans.cache_puts;
            puts.erase(std::remove_if(
                           puts.begin(), puts.end(),
                           [](const CachePut& put) { return put.key.shared; }),
                       puts.end());
          }
          plans.trust = std::move(now);
          MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> now_tasks,
                                 w.ListTasks(task.job_id()));
          if (DoneProfileBatches(now_tasks, task.task_id()) != max_batch.used &&
              prediction_round < kMaxPredictions) {
            return absl::AbortedError("another profile was stored meanwhile");
          }
          // The max batch is verified once, from the prediction over every
          // profile: by the report of the last one.
          if (max_batch.prediction.has_value() &&
              OtherProfilePending(now_tasks, task)) {
            DeferMaxBatchChecks(*max_batch.prediction);
            max_batch.to_verify.clear();
          }
          return WriteProfileResult(w, task, plans, max_batch.prediction,
                                    max_batch.to_verify, job);
        });
    if (absl::IsAborted(written)) continue;
    return written;
  }
}

absl::Status JobCore::WriteProfileResult(
    storage::Store::Writer& w, const v1::Task& task, const ProfilePlans& plans,
    const std::optional<v1::MaxBatchPrediction>& prediction,
    const std::vector<v1::Schedule>& to_verify, v1::Job& job) {
  bool final = false;
  MUTWO_RETURN_IF_ERROR(w.UpdateJob(task.job_id(), [&](v1::Job& j) {
                           final = IsFinal(j.state());
                           *FindOrAddResult(j, task.batch_size()) =
                               plans.result;
                           if (prediction.has_value()) {
                             *j.mutable_max_batch() = *prediction;
                           }
                           return absl::OkStatus();
                         }).status());
  if (!final) {
    for (const v1::Schedule& schedule : plans.result.schedules()) {
      if (!schedule.feasible()) continue;
      MUTWO_RETURN_IF_ERROR(w.AddTask(task.job_id(), v1::Task::VALIDATE,
                                      task.batch_size(), schedule)
                                .status());
    }
    for (const v1::Schedule& schedule : to_verify) {
      MUTWO_RETURN_IF_ERROR(w.AddTask(task.job_id(), v1::Task::MAX_BATCH,
                                      schedule.batch_size(), schedule)
                                .status());
    }
  }
  MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
  return absl::OkStatus();
}

}  // namespace mutwo
