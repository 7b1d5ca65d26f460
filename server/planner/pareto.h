// Budget sweeps and the non-dominated (peak, iteration time) frontier.
#ifndef MUTWO_SERVER_PLANNER_PARETO_H_
#define MUTWO_SERVER_PLANNER_PARETO_H_

#include <cstdint>
#include <vector>

namespace mutwo::planner {

struct ParetoPoint {
  int64_t budget_bytes = 0;
  int64_t predicted_peak_bytes = 0;
  double predicted_iteration_ms = 0;
  int recomputed = 0;
  int swapped = 0;
};

// `points` budgets evenly spaced from `floor_bytes` to `baseline_bytes`, both
// included, ascending and without duplicates (fewer when the range is
// narrower than `points` bytes). `points` < 2 is treated as 2.
std::vector<int64_t> BudgetSweep(int64_t floor_bytes, int64_t baseline_bytes,
                                 int points);

// The points no other point beats on both peak and time (ties keep the
// first), sorted by ascending peak (so by descending time).
std::vector<ParetoPoint> NonDominated(std::vector<ParetoPoint> points);

}  // namespace mutwo::planner

#endif  // MUTWO_SERVER_PLANNER_PARETO_H_
