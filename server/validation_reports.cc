// JobCore's validation reports: a VALIDATE round judged by the closed loop
// (closed_loop.h: fits, over the budget and re-planned for the next round,
// or ended), and a MAX_BATCH step judged by max_batch_check.h (verified,
// stepped down to the next batch size, or failed), each stored with the task
// it queues in one transaction.
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "server/closed_loop.h"
#include "server/job_core.h"
#include "server/job_rules.h"
#include "server/max_batch_check.h"
#include "server/max_batch_plans.h"

namespace mutwo {
namespace {

// Shows round `validation` of `budget` in its batch size's result: the
// validation, the outcome so far and the schedule the job shows for it (the
// re-planned one, or the one that ran marked with its measurement).
void ShowRound(v1::BatchResult& r, const v1::MemoryBudget& budget,
               const v1::Validation& validation,
               const v1::BudgetOutcome& outcome, const v1::Schedule& schedule) {
  *r.add_validations() = validation;
  bool shown = false;
  for (v1::Schedule& s : *r.mutable_schedules()) {
    if (s.budget().SerializeAsString() == budget.SerializeAsString()) {
      s = schedule;
      shown = true;
    }
  }
  if (!shown) *r.add_schedules() = schedule;
  if (v1::BudgetOutcome* o = FindOutcome(r, budget)) {
    *o = outcome;
  } else {
    *r.add_outcomes() = outcome;
  }
  if (budget.floor() && outcome.state() == v1::BudgetOutcome::FITS) {
    r.set_measured_floor_bytes(outcome.budget_bytes());
  }
}

}  // namespace

absl::Status JobCore::ReportValidation(
    const v1::ReportValidationRequest& request) {
  const ReportKey key = ReportKey::Of(request);
  MUTWO_ASSIGN_OR_RETURN(v1::Task task, store_->GetTask(request.task_id()));
  if (task.kind() == v1::Task::MAX_BATCH) {
    return ReportMaxBatchStep(request, task);
  }
  if (task.kind() != v1::Task::VALIDATE) {
    return RefuseReport(
        task, key,
        absl::InvalidArgumentError(absl::StrCat(
            "task ", task.task_id(), " is not a VALIDATE or MAX_BATCH task")));
  }
  MUTWO_ASSIGN_OR_RETURN(TaskReports::Admission admission,
                         reports_.Admit(task, key));
  if (admission == TaskReports::Admission::kRetried) return absl::OkStatus();
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task.job_id()));
  const v1::MemoryBudget& budget = task.schedule().budget();
  // The outcome so far; a job of an older server has none yet.
  v1::BudgetOutcome outcome = PlannedOutcome(task.schedule());
  if (const v1::BudgetOutcome* known =
          FindOutcome(*FindOrAddResult(job, task.batch_size()), budget)) {
    outcome = *known;
  }
  const int round = outcome.rounds() + 1;
  v1::Validation validation = request.validation();
  validation.set_round(round);
  std::vector<CachePut> cache_puts;
  MUTWO_ASSIGN_OR_RETURN(RoundResult next,
                         CloseRound(job, task, validation, round,
                                    std::move(outcome), &cache_puts));
  bool retried = false;
  MUTWO_RETURN_IF_ERROR(reports_.Write(
      key, request.validation().SerializeAsString(), &retried,
      [&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_RETURN_IF_ERROR(w.PutValidation(
            task.job_id(), task.batch_size(),
            budget.text().empty() ? FormatBudget(budget) : budget.text(), round,
            validation));
        bool final = false;
        MUTWO_RETURN_IF_ERROR(
            w.UpdateJob(task.job_id(), [&](v1::Job& j) {
               final = IsFinal(j.state());
               ShowRound(*FindOrAddResult(j, task.batch_size()), budget,
                         validation, next.outcome, next.schedule);
               return absl::OkStatus();
             }).status());
        if (next.next_round.has_value() && !final) {
          MUTWO_RETURN_IF_ERROR(w.AddTask(job.job_id(), v1::Task::VALIDATE,
                                          task.batch_size(), *next.next_round)
                                    .status());
        }
        MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
        return absl::OkStatus();
      }));
  if (retried) return absl::OkStatus();
  metrics_->CountValidation(next.metric_result);
  MUTWO_LOG(info, "job {} batch {} budget {}: round {} measured {}: {}{}",
            task.job_id(), task.batch_size(), FormatBudget(budget), round,
            FormatBytes(validation.scheduled().peak_bytes()),
            v1::BudgetOutcome::State_Name(next.outcome.state()),
            next.outcome.state() == v1::BudgetOutcome::VALIDATING
                ? absl::StrCat(" (round ", round + 1, " planned ",
                               FormatBytes(next.outcome.correction_bytes()),
                               " below the budget)")
            : next.outcome.reason().empty()
                ? ""
                : absl::StrCat(" (", next.outcome.reason(), ")"));
  FinishReport(job, cache_puts);
  return absl::OkStatus();
}

absl::Status JobCore::ReportMaxBatchStep(
    const v1::ReportValidationRequest& request, const v1::Task& task) {
  const ReportKey key = ReportKey::Of(request);
  MUTWO_ASSIGN_OR_RETURN(TaskReports::Admission admission,
                         reports_.Admit(task, key));
  if (admission == TaskReports::Admission::kRetried) return absl::OkStatus();
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task.job_id()));
  v1::MaxBatchPrediction prediction = job.max_batch();
  std::optional<MaxBatchStep> step;
  std::optional<v1::Schedule> next_step;
  if (const v1::MaxBatchCheck* check = CheckForTask(prediction, task)) {
    step =
        JudgeMaxBatchStep(*check, request.validation(), MaxBatchCheckOptions{});
    if (step->next == MaxBatchStep::Next::kStepDown) {
      // Planned again at the smaller batch size from every profile.
      MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> tasks,
                             store_->ListTasks(task.job_id()));
      const std::vector<v1::Profile> profiles =
          UsableProfiles(*store_, task.job_id(), DoneProfileBatches(tasks));
      auto schedule =
          profiles.size() >= 2
              ? MaxBatchSchedule(profiles, step->next_batch,
                                 step->check.capacity_bytes(),
                                 task.schedule().policy(),
                                 FragmentationMarginBytes(prediction))
              : absl::FailedPreconditionError("fewer than two profiles");
      if (schedule.ok()) {
        next_step = *std::move(schedule);
      } else {
        step->next = MaxBatchStep::Next::kFailed;
        step->check.set_state(v1::MaxBatchCheck::FAILED);
        step->check.set_reason(absl::StrCat(
            step->check.reason(), "; planning batch ", step->next_batch,
            " failed: ", schedule.status().message()));
      }
    }
  }
  bool retried = false;
  MUTWO_RETURN_IF_ERROR(reports_.Write(
      key, request.validation().SerializeAsString(), &retried,
      [&](storage::Store::Writer& w) -> absl::Status {
        bool final = false;
        MUTWO_RETURN_IF_ERROR(
            w.UpdateJob(task.job_id(), [&](v1::Job& j) {
               final = IsFinal(j.state());
               v1::MaxBatchPrediction& m = *j.mutable_max_batch();
               v1::MaxBatchCheck* c = CheckForTask(m, task);
               // A prediction replaced meanwhile has checks of its own.
               if (c == nullptr || !step.has_value()) return absl::OkStatus();
               *c = step->check;
               if (step->next == MaxBatchStep::Next::kVerified) {
                 // The reported answer is the verified one; one step
                 // without checkpointing answers both when they agreed.
                 if (c == m.mutable_without_checkpointing_check()) {
                   m.set_max_batch_without_checkpointing(c->batch_size());
                   if (!m.has_with_schedule_check()) {
                     m.set_max_batch_with_schedule(c->batch_size());
                   }
                 } else {
                   m.set_max_batch_with_schedule(c->batch_size());
                 }
               }
               return absl::OkStatus();
             }).status());
        if (next_step.has_value() && !final) {
          MUTWO_RETURN_IF_ERROR(w.AddTask(task.job_id(), v1::Task::MAX_BATCH,
                                          next_step->batch_size(), *next_step)
                                    .status());
        }
        MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
        return absl::OkStatus();
      }));
  if (retried) return absl::OkStatus();
  if (step.has_value()) {
    MUTWO_LOG(info, "job {} max batch {}: {}", task.job_id(),
              v1::MaxBatchCheck::State_Name(step->check.state()),
              step->check.reason());
  }
  FinishReport(job, /*cache_puts=*/{});
  return absl::OkStatus();
}

absl::StatusOr<JobCore::RoundResult> JobCore::CloseRound(
    const v1::Job& job, const v1::Task& task, const v1::Validation& validation,
    int round, v1::BudgetOutcome outcome, std::vector<CachePut>* cache_puts) {
  const v1::Schedule& ran = task.schedule();
  const RoundDecision decision =
      JudgeRound(ran, validation, round, loop_options_);
  const int64_t measured = validation.scheduled().peak_bytes();
  const bool measured_over = !validation.oom() && measured > ran.budget_bytes();
  outcome.set_rounds(round);
  outcome.set_measured_peak_bytes(validation.oom() ? 0 : measured);
  outcome.set_fits(false);
  outcome.clear_reason();
  RoundResult result;
  result.metric_result = decision.metric_result;
  std::string reason = decision.reason;
  switch (decision.next) {
    case RoundDecision::Next::kFits:
      outcome.set_state(v1::BudgetOutcome::FITS);
      outcome.set_fits(true);
      break;
    case RoundDecision::Next::kFailed:
      outcome.set_state(v1::BudgetOutcome::FAILED);
      break;
    case RoundDecision::Next::kOverBudget:
      outcome.set_state(v1::BudgetOutcome::OVER_BUDGET);
      break;
    case RoundDecision::Next::kFloorMeasured:
      // Proved at the peak measured, plus the margin for its run-to-run
      // jitter (MarkMeasured raises the schedule's budget to it below).
      outcome.set_state(v1::BudgetOutcome::FITS);
      outcome.set_fits(true);
      outcome.set_budget_bytes(MeasuredFloorBytes(measured));
      break;
    case RoundDecision::Next::kReplan: {
      MUTWO_ASSIGN_OR_RETURN(
          v1::Profile profile,
          store_->GetProfile(job.job_id(), task.batch_size()));
      MUTWO_ASSIGN_OR_RETURN(
          v1::Schedule replanned,
          Plan(profile, ran.budget(), ran.policy(), decision.correction_bytes));
      if (replanned.feasible()) {
        // The corrected plan replaces the one that overshot, for this job's
        // next round and for every later job with the same key.
        MUTWO_ASSIGN_OR_RETURN(
            std::shared_ptr<const CacheOwner> owner,
            ProfileOwnerOf(job.job_id(), job.owner(), task.batch_size()));
        cache_puts->push_back(
            CachePut{OwnKey(job.spec(), task.batch_size(), profile.device(),
                            ran.budget(), ran.policy(), *owner),
                     job.job_id(), replanned});
        result.schedule = ScheduleCache::Trim(std::move(replanned),
                                              /*include_pareto=*/false,
                                              /*include_timeline=*/false);
        result.next_round = result.schedule;
        outcome.set_state(v1::BudgetOutcome::VALIDATING);
        outcome.set_predicted_peak_bytes(
            result.schedule.predicted_peak_bytes());
        outcome.set_correction_bytes(result.schedule.correction_bytes());
        result.outcome = std::move(outcome);
        return result;
      }
      reason = NoRoomReason(replanned, measured, round);
      outcome.set_state(v1::BudgetOutcome::OVER_BUDGET);
      break;
    }
  }
  outcome.set_reason(reason);
  // Whatever else went wrong, a peak over the budget is a fact about the
  // plan that ran: the cache must not serve it as fitting again.
  if (decision.next == RoundDecision::Next::kFits ||
      decision.next == RoundDecision::Next::kFloorMeasured || measured_over) {
    MUTWO_RETURN_IF_ERROR(
        RecordMeasurement(job, task, measured, reason, cache_puts));
  }
  result.schedule =
      validation.oom() ? ran : MarkMeasured(ran, measured, reason);
  result.outcome = std::move(outcome);
  return result;
}

absl::Status JobCore::RecordMeasurement(const v1::Job& job,
                                        const v1::Task& task,
                                        int64_t measured_bytes,
                                        const std::string& reason,
                                        std::vector<CachePut>* cache_puts) {
  const v1::Schedule& ran = task.schedule();
  MUTWO_ASSIGN_OR_RETURN(std::shared_ptr<const v1::DeviceInfo> device,
                         ProfileDeviceOf(job.job_id(), task.batch_size()));
  MUTWO_ASSIGN_OR_RETURN(
      std::shared_ptr<const CacheOwner> owner,
      ProfileOwnerOf(job.job_id(), job.owner(), task.batch_size()));
  const storage::ScheduleCacheKey key =
      OwnKey(job.spec(), task.batch_size(), *device, ran.budget(), ran.policy(),
             *owner);
  // A shared entry this job was answered with, measured over its budget:
  // no job of any tenant is served it as fitting again. (Only over: a
  // measurement that fits raises nothing another job relies on.)
  storage::ScheduleCacheKey shared_key = key;
  shared_key.shared = true;
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> shared,
                         cache_.Peek(shared_key));
  if (shared.has_value() && SamePlan(*shared, ran) &&
      measured_bytes > ran.budget_bytes()) {
    cache_puts->push_back(
        CachePut{shared_key, job.job_id(),
                 MarkMeasured(*std::move(shared), measured_bytes, reason)});
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> entry, cache_.Peek(key));
  if (entry.has_value() && !SamePlan(*entry, ran)) {
    return absl::OkStatus();  // re-planned or marked since this round began
  }
  cache_puts->push_back(
      CachePut{key, job.job_id(),
               MarkMeasured(entry.has_value() ? *std::move(entry) : ran,
                            measured_bytes, reason)});
  return absl::OkStatus();
}

}  // namespace mutwo
