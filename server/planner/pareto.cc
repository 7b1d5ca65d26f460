#include "server/planner/pareto.h"

#include <algorithm>
#include <limits>

namespace mutwo::planner {

std::vector<int64_t> BudgetSweep(int64_t floor_bytes, int64_t baseline_bytes,
                                 int points) {
  if (points < 2) points = 2;
  if (baseline_bytes < floor_bytes) std::swap(baseline_bytes, floor_bytes);
  std::vector<int64_t> budgets;
  const long double step =
      static_cast<long double>(baseline_bytes - floor_bytes) / (points - 1);
  for (int i = 0; i < points; ++i) {
    const int64_t b = i == points - 1
                          ? baseline_bytes
                          : floor_bytes + static_cast<int64_t>(step * i);
    if (budgets.empty() || budgets.back() != b) budgets.push_back(b);
  }
  return budgets;
}

std::vector<ParetoPoint> NonDominated(std::vector<ParetoPoint> points) {
  std::stable_sort(
      points.begin(), points.end(),
      [](const ParetoPoint& a, const ParetoPoint& b) {
        return a.predicted_peak_bytes != b.predicted_peak_bytes
                   ? a.predicted_peak_bytes < b.predicted_peak_bytes
                   : a.predicted_iteration_ms < b.predicted_iteration_ms;
      });
  std::vector<ParetoPoint> out;
  double best_ms = std::numeric_limits<double>::infinity();
  for (const ParetoPoint& p : points) {
    if (p.predicted_iteration_ms < best_ms) {
      out.push_back(p);
      best_ms = p.predicted_iteration_ms;
    }
  }
  return out;
}

}  // namespace mutwo::planner
