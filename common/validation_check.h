// What a Validation proves about the schedule it ran, judged the same way by
// the offline `mutwo-worker execute` and by mutwo-server's closed loop: the
// step ran (no out-of-memory), its measured peak is within the budget, and
// it computed what the unmodified step computes (gradients, loss and
// batch-norm statistics; not judged when the baseline step was skipped).
// Stateless and thread-safe.
#ifndef MUTWO_COMMON_VALIDATION_CHECK_H_
#define MUTWO_COMMON_VALIDATION_CHECK_H_

#include <cstdint>
#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

// The largest |loss difference| accepted between the scheduled and the
// unmodified step. Recomputation replays the same forward arithmetic and
// swapping copies bytes, so the loss is normally identical; the slack is for
// nondeterministic kernels on GPUs.
inline constexpr double kMaxLossDiff = 1e-4;

struct ValidationCheck {
  bool out_of_memory = false;
  // The measured scheduled peak is at most the budget (true without a
  // budget). False after an out-of-memory.
  bool within_budget = false;
  // Gradients, loss and batch-norm statistics match the unmodified step;
  // true when the baseline was skipped (nothing to compare with).
  bool matches_baseline = false;
  // Empty when the validation proves its schedule; otherwise one line naming
  // every problem, e.g. "measured peak 70.00 KiB exceeds the budget
  // 50.00 KiB by 40.0%; gradients differ from the unmodified step (max
  // |diff| 0.5)".
  std::string problem;

  bool ok() const { return problem.empty(); }
};

ValidationCheck CheckValidation(const v1::Validation& validation);

// Whether `validation` is the round that settled `outcome` (its last round,
// for its budget; a measured floor's budget is the peak measured, so that
// round is found by its peak).
bool IsOutcomeRound(const v1::Validation& validation,
                    const v1::BudgetOutcome& outcome);

// "measured peak 70.00 KiB exceeds the budget 50.00 KiB by 40.0%".
std::string OverBudgetMessage(int64_t measured_bytes, int64_t budget_bytes);

}  // namespace mutwo

#endif  // MUTWO_COMMON_VALIDATION_CHECK_H_
