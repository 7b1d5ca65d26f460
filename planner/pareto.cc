#include "planner/pareto.h"

#include <algorithm>
#include <cmath>
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

namespace {

// Each point's Kneedle score (KneeIndex): its peak and time, each scaled to
// [0, 1] over the curve, summed.
std::vector<double> KneeScores(const std::vector<ParetoPoint>& curve) {
  std::vector<double> score;
  if (curve.empty()) return score;
  int64_t peak_min = curve.front().predicted_peak_bytes, peak_max = peak_min;
  double ms_min = curve.front().predicted_iteration_ms, ms_max = ms_min;
  for (const ParetoPoint& p : curve) {
    peak_min = std::min(peak_min, p.predicted_peak_bytes);
    peak_max = std::max(peak_max, p.predicted_peak_bytes);
    ms_min = std::min(ms_min, p.predicted_iteration_ms);
    ms_max = std::max(ms_max, p.predicted_iteration_ms);
  }
  const double peak_range = static_cast<double>(peak_max - peak_min);
  const double ms_range = ms_max - ms_min;
  for (const ParetoPoint& p : curve) {
    const double peak =
        peak_range > 0
            ? static_cast<double>(p.predicted_peak_bytes - peak_min) /
                  peak_range
            : 0;
    const double ms =
        ms_range > 0 ? (p.predicted_iteration_ms - ms_min) / ms_range : 0;
    score.push_back(peak + ms);
  }
  return score;
}

}  // namespace

int KneeIndex(const std::vector<ParetoPoint>& curve) {
  const std::vector<double> score = KneeScores(curve);
  // Relative tolerance for "the same sum": a straight curve's points differ
  // only by rounding and must keep the lowest peak.
  constexpr double kTie = 1e-9;
  int best = -1;
  for (size_t i = 0; i < curve.size(); ++i) {
    const bool lower_peak = best < 0 || curve[i].predicted_peak_bytes <
                                            curve[best].predicted_peak_bytes;
    if (best < 0 || score[i] < score[best] - kTie ||
        (score[i] <= score[best] + kTie && lower_peak)) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

int64_t KneeBudget(const std::vector<ParetoPoint>& curve) {
  if (curve.empty()) return -1;
  const std::vector<double> score = KneeScores(curve);
  const double best = *std::min_element(score.begin(), score.end());
  long double weighted = 0, total = 0;
  for (size_t i = 0; i < curve.size(); ++i) {
    const long double w = std::exp(-(score[i] - best) / kKneeSmoothing);
    weighted += w * static_cast<long double>(curve[i].budget_bytes);
    total += w;
  }
  // The curve's budget nearest the average: a budget the Pareto table
  // lists, the same one as long as the average stays nearer it than its
  // neighbours.
  const long double average = weighted / total;
  int64_t nearest = curve.front().budget_bytes;
  for (const ParetoPoint& p : curve) {
    if (std::abs(static_cast<long double>(p.budget_bytes) - average) <
        std::abs(static_cast<long double>(nearest) - average)) {
      nearest = p.budget_bytes;
    }
  }
  return nearest;
}

}  // namespace mutwo::planner
