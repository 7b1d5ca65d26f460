#include "common/validation_check.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"

namespace mutwo {

std::string OverBudgetMessage(int64_t measured_bytes, int64_t budget_bytes) {
  const double pct =
      budget_bytes > 0
          ? 100.0 * static_cast<double>(measured_bytes - budget_bytes) /
                static_cast<double>(budget_bytes)
          : 0.0;
  return absl::StrFormat("measured peak %s exceeds the budget %s by %.1f%%",
                         FormatBytes(measured_bytes), FormatBytes(budget_bytes),
                         pct);
}

bool IsOutcomeRound(const v1::Validation& v, const v1::BudgetOutcome& o) {
  const bool same_budget = v.budget_bytes() == o.budget_bytes() ||
                           (o.budget().floor() && v.scheduled().peak_bytes() ==
                                                      o.measured_peak_bytes());
  return same_budget && v.round() == o.rounds();
}

ValidationCheck CheckValidation(const v1::Validation& v) {
  ValidationCheck check;
  std::vector<std::string> problems;
  if (v.oom()) {
    check.out_of_memory = true;
    problems.push_back(absl::StrCat("out of memory: ", v.error()));
  } else {
    check.within_budget =
        v.budget_bytes() <= 0 || v.scheduled().peak_bytes() <= v.budget_bytes();
    if (!check.within_budget) {
      problems.push_back(
          OverBudgetMessage(v.scheduled().peak_bytes(), v.budget_bytes()));
    }
  }
  if (v.baseline_skipped()) {
    check.matches_baseline = true;
  } else if (!v.oom()) {
    std::vector<std::string> differ;
    if (!v.gradients_match()) {
      differ.push_back(
          v.worst_gradient_parameter().empty()
              ? absl::StrFormat("gradients (max |diff| %g)",
                                v.max_abs_grad_diff())
              : absl::StrFormat("gradients (max |diff| %g, worst at %s)",
                                v.max_abs_grad_diff(),
                                v.worst_gradient_parameter()));
    }
    // Written so that a NaN difference counts as differing.
    if (!(v.loss_diff() <= kMaxLossDiff)) {
      differ.push_back(absl::StrFormat("loss (diff %g)", v.loss_diff()));
    }
    if (!v.batchnorm_stats_match()) differ.push_back("batch-norm statistics");
    check.matches_baseline = differ.empty();
    if (!differ.empty()) {
      problems.push_back(absl::StrCat(absl::StrJoin(differ, ", "),
                                      " differ from the unmodified step"));
    }
  }
  check.problem = absl::StrJoin(problems, "; ");
  return check;
}

}  // namespace mutwo
