// The planner facade: one profile, one policy, many budgets. Resolves the
// decisions of a policy for a budget in bytes, says whether they fit and what
// the lowest reachable peak (the floor) is, and sweeps budgets for the
// Pareto curve. All predictions come from the Simulator.
//
// μ-TWO. Two budget-independent Algorithm B trajectories are run once, down
// to the floor: the paper's (largest recompute ratio first) and a
// cheapest-first one; each accepted step is followed by refinement (earlier
// choices that are no longer needed go back to RETAIN). A candidate plan for
// budget b takes, in each trajectory, the first state that fits b, then
// improves it for b: pruning (a choice whose removal still fits b without
// adding time goes back to RETAIN) and exchange (a recomputation replaced by
// a cheaper one that still fits). The answer for b is the cheapest candidate
// over b and every tighter budget at which the candidate changes (the
// procedure only depends on b through "peak <= b" tests, so these budgets
// are found exactly, one below the highest peak each candidate relied on).
// Hence a tighter budget never gives a lower predicted time.
//
// Effort is bounded by Options (refinement only on graphs up to a size,
// simulations per candidate, envelope probes); PlanResult says when a bound
// was hit.
//
// Not thread-safe (the simulator has scratch buffers): one Planner per
// request or per thread.
#ifndef MUTWO_SERVER_PLANNER_PLANNER_H_
#define MUTWO_SERVER_PLANNER_PLANNER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/planner/model.h"
#include "server/planner/mutwo_policy.h"
#include "server/planner/pareto.h"
#include "server/planner/simulator.h"

namespace mutwo::planner {

struct PlanResult {
  // Candidates evaluated for this budget and tighter ones, and simulations
  // run for them; `bounded` when an effort bound cut the search short (the
  // monotonicity guarantee then holds only for the budgets searched).
  int probes = 0;
  int64_t simulations = 0;
  bool bounded = false;
  Policy policy = Policy::kMutwo;
  int64_t budget_bytes = 0;
  bool feasible = false;
  // Lowest simulated peak this policy reaches: the μ-TWO trajectory's
  // minimum, or the fixed schedule's own peak for the baselines.
  int64_t floor_bytes = 0;
  int64_t baseline_peak_bytes = 0;
  double baseline_iteration_ms = 0;
  Decisions decisions;
  SimResult sim;
  std::string reason;  // why infeasible
};

class Planner {
 public:
  struct Options {
    Policy policy = Policy::kMutwo;
    bool allow_swap = true;  // μ-TWO only
    // Keep the per-position memory curves in PlanResult::sim.
    bool record_curve = false;
    // μ-TWO effort bounds.
    int refine_max_activations = 1500;
    int64_t max_improve_simulations = 400;  // per candidate
    int max_probes = 64;                    // candidates per Plan()
  };

  // Errors: InvalidArgument for an inconsistent profile (Simulator::Create).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Planner>> Create(
      PlanProfile profile, Options options);

  PlanResult Plan(int64_t budget_bytes);
  // Non-dominated points of a sweep of `points` budgets from the floor to
  // the baseline peak.
  std::vector<ParetoPoint> Pareto(int points);
  int64_t FloorBytes();

  const PlanProfile& profile() const { return profile_; }
  const Simulator& simulator() const { return *sim_; }
  const Options& options() const { return options_; }
  // μ-TWO trajectory `order` (0: ratio, 1: cheapest) down to the floor.
  const std::vector<TrajectoryStep>& Trajectory(int order = 0);

 private:
  struct Candidate {
    Decisions decisions;
    double iteration_ms = 0;
    int64_t peak_bytes = 0;
    // The candidate is the same for every budget in [critical_bytes, b];
    // INT64_MIN when no schedule fits b.
    int64_t critical_bytes = 0;
    int64_t simulations = 0;
    bool bounded = false;
  };

  Planner(PlanProfile profile, Options options)
      : profile_(std::move(profile)), options_(options) {}

  Candidate MakeCandidate(int64_t budget_bytes);
  // Improves `decisions` (fitting `budget_bytes`) by pruning and exchange.
  void Improve(int64_t budget_bytes, Candidate& c);

  PlanProfile profile_;
  Options options_;
  std::unique_ptr<Simulator> sim_;
  std::unique_ptr<MutwoPolicy> policies_[2];
  std::optional<std::vector<TrajectoryStep>> trajectories_[2];
  std::optional<SimResult> fixed_;  // the baselines' single schedule
  Decisions fixed_decisions_;
};

}  // namespace mutwo::planner

#endif  // MUTWO_SERVER_PLANNER_PLANNER_H_
