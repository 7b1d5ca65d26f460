// The μ-TWO scheduling policy (Purandare et al., MLSys 2023, Appendix B,
// Algorithm B with C-F, re-simulating with G after every choice).
//
// Each round looks at the position of the current simulated peak and at the
// candidates that are inactive there (last forward use < peak < first
// backward use): the swap candidate with the largest inactive time (overhead:
// the prefetch time not hidden behind the backward compute and replays
// before its first use, Algorithm C) and the recompute candidate with the
// largest recompute ratio = bytes / total recompute time (Algorithm D). It
// takes the cheaper, updates the recompute lineage of chosen recomputations
// (E) and of the remaining candidates (F), and re-runs the simulator over the
// whole timeline. A choice that raises the simulated peak is undone and that
// action is not tried again for that activation. It stops when the peak fits
// the budget or no candidate is inactive at the peak.
//
// The choices do not depend on the budget, only when to stop does: the plan
// for a tighter budget extends the plan for a looser one. Not thread-safe.
#ifndef MUTWO_SERVER_PLANNER_MUTWO_POLICY_H_
#define MUTWO_SERVER_PLANNER_MUTWO_POLICY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/planner/model.h"
#include "server/planner/simulator.h"

namespace mutwo::planner {

// One accepted choice and the simulated result after it.
struct TrajectoryStep {
  int activation = 0;
  Action action = Action::kRetain;
  int prefetch_at = -1;
  double estimated_overhead_ms = 0;  // Algorithm C or D, when chosen
  // Earlier choices returned to RETAIN by refinement after this step.
  std::vector<int> retained_again;
  int64_t peak_bytes = 0;
  double iteration_ms = 0;
};

class MutwoPolicy {
 public:
  struct Options {
    // Consider SWAP at all (also requires the profile's bandwidths).
    bool allow_swap = true;
    // Consider RECOMPUTE at all.
    bool allow_recompute = true;
    // Recompute candidate of a round: the largest recompute ratio (the
    // paper's rule), or the smallest total recompute time (a second
    // trajectory that wins when little memory has to be saved).
    enum class Order { kRatio, kCheapest };
    Order order = Order::kRatio;
    // After each accepted step, return earlier choices to RETAIN when that
    // keeps the simulated peak at or below the current one and does not add
    // time (budget-independent pruning; costs one simulation per choice).
    bool refine = true;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MutwoPolicy>> Create(
      const Simulator* simulator, Options options);

  // Runs rounds from "retain everything" until the simulated peak is at most
  // `budget_bytes` (0: until no candidate helps). `trajectory` (optional)
  // receives every accepted step. Returns the decisions at the stop.
  Decisions Run(int64_t budget_bytes, std::vector<TrajectoryStep>* trajectory);

 private:
  MutwoPolicy(const Simulator* simulator, Options options)
      : sim_(simulator), options_(options) {}

  // Refinement after a step; updates `decisions` and `current`, appends the
  // activations returned to RETAIN to `retained_again`.
  void Refine(Decisions& decisions, int just_chosen, SimResult& current,
              std::vector<int>& retained_again) const;

  const Simulator* sim_;
  Options options_;
};

// The decisions after the first `steps` steps of a trajectory.
Decisions DecisionsAfter(int activation_count,
                         const std::vector<TrajectoryStep>& trajectory,
                         size_t steps);

}  // namespace mutwo::planner

#endif  // MUTWO_SERVER_PLANNER_MUTWO_POLICY_H_
