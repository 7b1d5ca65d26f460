#include "server/closed_loop.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/parse.h"
#include "common/validation_check.h"

namespace mutwo {
namespace {

std::string Rounds(int rounds) {
  return absl::StrCat(rounds, rounds == 1 ? " round" : " rounds");
}

}  // namespace

v1::BudgetOutcome PlannedOutcome(const v1::Schedule& schedule) {
  v1::BudgetOutcome outcome;
  *outcome.mutable_budget() = schedule.budget();
  outcome.set_budget_bytes(schedule.budget_bytes());
  outcome.set_predicted_peak_bytes(schedule.predicted_peak_bytes());
  outcome.set_correction_bytes(schedule.correction_bytes());
  outcome.set_floor_bytes(schedule.floor_bytes());
  if (schedule.feasible()) {
    outcome.set_state(v1::BudgetOutcome::VALIDATING);
  } else if (schedule.measured_peak_bytes() > schedule.budget_bytes()) {
    outcome.set_state(v1::BudgetOutcome::OVER_BUDGET);
    outcome.set_measured_peak_bytes(schedule.measured_peak_bytes());
    outcome.set_reason(schedule.reason());
  } else {
    outcome.set_state(v1::BudgetOutcome::INFEASIBLE);
    // The planner's words (the floor, what sets it, the baseline peak), as
    // `mutwo plan` prints them; its own only for a schedule without them.
    outcome.set_reason(absl::StrCat(
        schedule.reason().empty()
            ? absl::StrCat("the budget ", FormatBytes(schedule.budget_bytes()),
                           " is below the floor ",
                           FormatBytes(schedule.floor_bytes()))
            : schedule.reason(),
        "; nothing run"));
  }
  return outcome;
}

std::string OverBudgetReason(int64_t measured_bytes, int64_t budget_bytes,
                             int rounds, int64_t floor_bytes) {
  return absl::StrCat("measured ", FormatBytes(measured_bytes), " > budget ",
                      FormatBytes(budget_bytes), " after ", Rounds(rounds),
                      "; floor ", FormatBytes(floor_bytes));
}

std::string NoRoomReason(const v1::Schedule& replanned, int64_t measured_bytes,
                         int rounds) {
  return absl::StrCat(
      "measured ", FormatBytes(measured_bytes), " > budget ",
      FormatBytes(replanned.budget_bytes()), " after ", Rounds(rounds),
      "; no schedule is predicted to fit ",
      FormatBytes(replanned.correction_bytes()),
      " below the budget (the overshoot measured, plus a margin); floor ",
      FormatBytes(replanned.floor_bytes()));
}

int64_t MeasuredFloorBytes(int64_t measured_bytes) {
  return measured_bytes +
         static_cast<int64_t>(std::ceil(kMeasuredFloorMargin *
                                        static_cast<double>(measured_bytes)));
}

std::string MeasuredFloorReason(int64_t measured_bytes,
                                int64_t predicted_floor_bytes) {
  return absl::StrCat(
      "the floor measured ", FormatBytes(measured_bytes), " (predicted ",
      FormatBytes(predicted_floor_bytes),
      absl::StrFormat(", %+.1f%%",
                      100.0 * (static_cast<double>(measured_bytes) /
                                   static_cast<double>(std::max<int64_t>(
                                       1, predicted_floor_bytes)) -
                               1)),
      "); ", FormatBytes(MeasuredFloorBytes(measured_bytes)),
      absl::StrFormat(" with a %.2f%%", 100.0 * kMeasuredFloorMargin),
      " margin for the peak's run-to-run jitter is the lowest budget this "
      "schedule is proved to fit");
}

RoundDecision JudgeRound(const v1::Schedule& schedule,
                         const v1::Validation& validation, int round,
                         const ClosedLoopOptions& options) {
  RoundDecision decision;
  const ValidationCheck check = CheckValidation(validation);
  if (check.ok()) {
    decision.next = RoundDecision::Next::kFits;
    decision.metric_result = "fits";
    return decision;
  }
  if (check.out_of_memory || !check.matches_baseline) {
    // Planning lower does not make a step correct; nor is an out-of-memory
    // (the device's capacity, not the budget) a measured overshoot.
    decision.next = RoundDecision::Next::kFailed;
    decision.metric_result = "failed";
    decision.reason = absl::StrCat(check.problem, " (round ", round, ")");
    return decision;
  }
  const int64_t measured = validation.scheduled().peak_bytes();
  decision.metric_result = "over_budget";
  if (schedule.budget().floor()) {
    decision.next = RoundDecision::Next::kFloorMeasured;
    decision.reason = MeasuredFloorReason(measured, schedule.budget_bytes());
    return decision;
  }
  if (round >= options.max_rounds) {
    decision.next = RoundDecision::Next::kOverBudget;
    decision.reason = OverBudgetReason(measured, schedule.budget_bytes(), round,
                                       schedule.floor_bytes());
    return decision;
  }
  decision.next = RoundDecision::Next::kReplan;
  decision.correction_bytes =
      CorrectionAfter(schedule, measured, options.margin_fraction);
  return decision;
}

int64_t CorrectionAfter(const v1::Schedule& schedule, int64_t measured_bytes,
                        double margin_fraction) {
  const int64_t margin = static_cast<int64_t>(std::ceil(
      margin_fraction * static_cast<double>(schedule.budget_bytes())));
  const int64_t overshoot = measured_bytes - schedule.predicted_peak_bytes();
  return std::max(schedule.correction_bytes() + std::max<int64_t>(margin, 1),
                  overshoot + margin);
}

v1::Schedule MarkMeasured(v1::Schedule schedule, int64_t measured_bytes,
                          const std::string& reason) {
  schedule.set_measured_peak_bytes(measured_bytes);
  if (measured_bytes <= schedule.budget_bytes()) return schedule;
  if (schedule.budget().floor()) {
    // Nothing is planned below the floor: the floor is what was measured,
    // with the margin another process's run of it needs.
    const int64_t floor = MeasuredFloorBytes(measured_bytes);
    schedule.set_budget_bytes(floor);
    schedule.set_floor_bytes(std::max(schedule.floor_bytes(), floor));
  } else {
    schedule.set_feasible(false);
  }
  schedule.set_reason(absl::StrCat(
      reason, schedule.reason().empty() ? "" : "; ", schedule.reason()));
  return schedule;
}

bool SamePlan(const v1::Schedule& a, const v1::Schedule& b) {
  auto plan = [](v1::Schedule s) {
    s.clear_pareto();
    s.clear_timeline();
    s.clear_measured_peak_bytes();
    return s.SerializeAsString();
  };
  return plan(a) == plan(b);
}

v1::BudgetOutcome* FindOutcome(v1::BatchResult& result,
                               const v1::MemoryBudget& budget) {
  const std::string wanted = budget.SerializeAsString();
  for (v1::BudgetOutcome& outcome : *result.mutable_outcomes()) {
    if (outcome.budget().SerializeAsString() == wanted) return &outcome;
  }
  return nullptr;
}

}  // namespace mutwo
