// The closed loop's rules: a schedule is reported as fitting only once a
// worker measured it within its budget. When a round measures over the
// budget, the (batch size, budget) is planned again below the budget by
// what the round overshot its prediction plus a margin
// (Schedule.correction_bytes) and validated again, at most `max_rounds`
// rounds; then, or when the correction leaves no schedule above the
// planner's floor, it is reported as not fitting with the reason.
//
// Why the correction is sound: the planner's error at one batch size is
// mostly additive (allocator rounding, workspaces and temporaries the
// profile does not attribute), so a plan predicted to peak at most
// budget - (measured - predicted) - margin measures at most budget - margin
// when the error repeats. A round that still overshoots has, by
// construction, a larger error than the correction it ran with, so the
// correction grows by at least the margin every round.
//
// Pure functions over the protos (no store, no clock, thread-safe); JobCore
// sequences them.
#ifndef MUTWO_SERVER_CLOSED_LOOP_H_
#define MUTWO_SERVER_CLOSED_LOOP_H_

#include <cstdint>
#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

struct ClosedLoopOptions {
  // Validation rounds per (batch size, budget), the first included.
  int max_rounds = 3;
  // Margin added to the measured overshoot, as a fraction of the budget.
  double margin_fraction = 0.01;
};

// The outcome of a schedule just planned (or served by the cache):
// VALIDATING when feasible (a round will run), OVER_BUDGET when a worker
// measured it over the budget before (the cache keeps that), else
// INFEASIBLE (the budget is below the planner's floor).
v1::BudgetOutcome PlannedOutcome(const v1::Schedule& schedule);

// What follows round `round` (from 1) that measured `validation` for
// `schedule`.
struct RoundDecision {
  enum class Next {
    kFits,        // within the budget and matching the unmodified step
    kReplan,      // over the budget, rounds left: plan with the correction
    kOverBudget,  // over the budget in the last round
    kFailed,      // out of memory, or differs from the unmodified step
    // The budget `floor` measured over its prediction: nothing is planned
    // lower than the floor, so the measured peak is the floor (FITS at the
    // measured peak, which becomes the outcome's budget).
    kFloorMeasured,
  };
  Next next = Next::kFailed;
  int64_t correction_bytes = 0;  // kReplan: for the next plan
  std::string reason;            // kOverBudget and kFailed
  // The mutwo_validations_total label: fits, over_budget or failed.
  std::string metric_result;
};
RoundDecision JudgeRound(const v1::Schedule& schedule,
                         const v1::Validation& validation, int round,
                         const ClosedLoopOptions& options);

// The correction to plan `schedule`'s budget again with after a step of it
// measured `measured_bytes`: its overshoot over the prediction plus
// `margin_fraction` of the budget, and at least its own correction plus
// that margin (at least a byte), so a persistent overshoot grows it.
int64_t CorrectionAfter(const v1::Schedule& schedule, int64_t measured_bytes,
                        double margin_fraction);

// "measured 3.77 GiB > budget 3.39 GiB after 3 rounds; floor 3.60 GiB".
std::string OverBudgetReason(int64_t measured_bytes, int64_t budget_bytes,
                             int rounds, int64_t floor_bytes);
// When the plan with the correction is infeasible: the overshoot, the
// correction tried and the floor.
std::string NoRoomReason(const v1::Schedule& replanned, int64_t measured_bytes,
                         int rounds);

// A floor measured over its prediction is shown, served and re-validated
// as the measured peak plus this fraction of it. The same schedule's peak
// moves between processes (on CUDA by 0.01-0.05% in the zoo runs: a few
// hundred KiB of allocator blocks and library workspaces), so a budget set
// at exactly one process's peak missed in the next (zoo-ext
// 2026-11-28-h200x4-2: vit_tiny_patch16_224 +0.05%, nasnetalarge +0.01%).
// 0.25% is five times the largest move seen.
inline constexpr double kMeasuredFloorMargin = 0.0025;

// measured + ceil(kMeasuredFloorMargin * measured): the budget a measured
// floor is proved for.
int64_t MeasuredFloorBytes(int64_t measured_bytes);

// The outcome's reason when the floor measured over its prediction:
// "the floor measured 3.71 GiB (predicted 3.60 GiB, +3.1%); 3.72 GiB with a
// 0.25% margin for the peak's run-to-run jitter is the lowest budget this
// schedule is proved to fit".
std::string MeasuredFloorReason(int64_t measured_bytes,
                                int64_t predicted_floor_bytes);

// `schedule` with the peak a worker measured; over the budget it becomes
// infeasible with `reason` in front of its own, except for the budget
// `floor`, which becomes MeasuredFloorBytes of the peak (still feasible).
v1::Schedule MarkMeasured(v1::Schedule schedule, int64_t measured_bytes,
                          const std::string& reason);

// The same plan: equal but for the Pareto curve, the timeline and what was
// measured (measured_peak_bytes).
bool SamePlan(const v1::Schedule& a, const v1::Schedule& b);

// The outcome for `budget` in `result` (budgets compared field by field),
// nullptr when there is none.
v1::BudgetOutcome* FindOutcome(v1::BatchResult& result,
                               const v1::MemoryBudget& budget);

}  // namespace mutwo

#endif  // MUTWO_SERVER_CLOSED_LOOP_H_
