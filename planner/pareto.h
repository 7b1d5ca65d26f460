// Budget sweeps and the non-dominated (peak, iteration time) frontier.
#ifndef MUTWO_PLANNER_PARETO_H_
#define MUTWO_PLANNER_PARETO_H_

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

// The knee of a non-dominated curve (as NonDominated returns it: ascending
// peak, descending time): the point farthest below the chord from the
// lowest-peak point to the fastest one once both axes are scaled to [0, 1]
// over the curve (Kneedle), i.e. the point with the smallest
//   (peak - peak_min) / (peak_max - peak_min)
//     + (time - time_min) / (time_max - time_min).
// An axis with no range counts 0 for every point (all times equal: the
// lowest peak wins). Ties keep the lower peak; a straight curve (every
// point on the chord) gives its lowest peak. Returns the index, -1 for an
// empty curve.
int KneeIndex(const std::vector<ParetoPoint>& curve);

// How far (in KneeIndex's score, 0 to 2) from the best a point still counts
// towards the knee's budget: its weight is exp(-(score - best) / this).
inline constexpr double kKneeSmoothing = 0.05;

// The budget `auto` resolves to: the budgets of the curve's points averaged
// with weights exp(-(score - best score) / kKneeSmoothing) over KneeIndex's
// scores, then the curve's budget nearest that average. Near a sharp knee
// that is the knee's budget; where several points are nearly as good (a
// flat stretch of the score) it is the one in their middle, where the plain
// arg-min jumps between them with a few % of noise on the op times.
// Budgets, not predicted peaks: a sweep's budgets come from the memory
// figures alone, its peaks from plans the times choose. Over 36 random
// 40-op models with each time off by up to 3%, it moved in 2 of 36 (by 0.3%
// on average, at most 5.7%); the arg-min's peak moved in 8 (1.9% on
// average, at most 19%) (PlanRequestTest.AutoBudgetIsStableUnderTimingNoise).
// -1 for an empty curve.
int64_t KneeBudget(const std::vector<ParetoPoint>& curve);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_PARETO_H_
