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
// action is not tried again for that activation; so is a swap that does not
// lower the high-water mark at the peak position (its offload, queued behind
// the others on the one device->host link, ends after it). When no
// candidate is left at the peak, a swapped activation that is still resident
// there (inactive, offload not done) is rebuilt by recomputation instead, if
// that lowers the mark at the peak (best recompute key first). It stops when
// the peak fits the budget or none of these helps.
//
// The choices do not depend on the budget, only when to stop does: the plan
// for a tighter budget extends the plan for a looser one. Not thread-safe.
//
// Memory-only rounds without refinement (the large-graph policy) run the
// same algorithm on an IncrementalSimulator (only the intervals a choice
// touches are updated; exact) with the candidates in interval indexes keyed
// by inactive time and recompute ratio (the best one inactive at the peak
// in O(log^2) instead of a scan): the same choices, step by step, as the
// full re-simulation (Options::incremental off), which tests check.
#ifndef MUTWO_PLANNER_MUTWO_POLICY_H_
#define MUTWO_PLANNER_MUTWO_POLICY_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/interrupt.h"
#include "planner/model.h"
#include "planner/simulator.h"

namespace mutwo::planner {

class Lineage;         // recompute lineage bookkeeping (Algorithms D-F)
class CandidateIndex;  // best candidate inactive at a position
class IncrementalSimulator;

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
    // Run the time model (prefetch stalls) in every round; off, rounds
    // simulate memory only and TrajectoryStep::iteration_ms leaves out
    // stalls. Refinement needs it.
    bool time_each_step = true;
    // Memory-only rounds without refinement (the large-graph policy): keep
    // the plan in an IncrementalSimulator and the candidates in interval
    // indexes instead of re-simulating the whole timeline and scanning every
    // candidate each round. Exact: the same choices as with it off (the
    // full re-simulation, kept as the reference). Ignored when refinement or
    // per-step timing is on, or when step times are not monotone.
    bool incremental = true;
    // Decisions the rounds start from instead of "retain everything" (empty:
    // retain everything), e.g. a fixed checkpointing schedule the greedy then
    // takes further down. RECOMPUTE entries join the recompute lineage (E/F)
    // as chosen; SWAP entries are not allowed (Create refuses them).
    Decisions seed;
    // When set (not owned; must outlive the policy), polled while Create
    // and Reset build the round state: on a graph of 16k nodes that takes
    // about a second, and a drain or a cancelled request must not wait for
    // it. Steps are not polled here: the Planner polls between them.
    Interrupt* interrupt = nullptr;
  };

  // Errors: InvalidArgument for a bad seed; the interrupt's status
  // (Cancelled, DeadlineExceeded) when it stopped the build.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MutwoPolicy>> Create(
      const Simulator* simulator, Options options);
  ~MutwoPolicy();

  // Runs rounds from the seed (default "retain everything") until the simulated
  // peak is at most `budget_bytes` (0: until no candidate helps). `trajectory`
  // (optional) receives every accepted step. Returns the decisions at the stop.
  Decisions Run(int64_t budget_bytes, std::vector<TrajectoryStep>* trajectory);

  // Resumable form: Step() runs rounds until one choice is accepted and
  // describes it in `step`; false once no candidate helps (the floor).
  // Reset() starts over from the seed; the interrupt's status when it
  // stopped the rebuild, after which Step() finds no candidate until a
  // Reset() that completes.
  [[nodiscard]] absl::Status Reset();
  bool Step(TrajectoryStep* step);
  const Decisions& decisions() const { return decisions_; }
  // Simulated peak of the current decisions.
  int64_t peak_bytes() const;
  // Whether rounds run on the incremental simulator (Options::incremental
  // and its conditions).
  bool incremental() const { return incremental_; }

 private:
  MutwoPolicy(const Simulator* simulator, Options options);

  // Step() on the incremental simulator and candidate indexes.
  bool IncrementalStep(TrajectoryStep* step);
  [[nodiscard]] absl::Status ResetIncremental();
  // Whether the interrupt stopped (polled once every 1024 `i`: a poll reads
  // the clock, the per-activation loops it guards are far cheaper); sets
  // done_, so that a half-built state offers no step.
  bool StoppedAt(size_t i);
  // The recompute key of the full scan (ratio or cheapest) for a candidate.
  double RecomputeKey(int candidate) const;
  // After the lineage changed a candidate's total.
  void UpdateRecomputeKey(int candidate);

  // The swapped activation with the best recompute key that is inactive at
  // `pp` and still resident there (offload_done_at(c) > pp), not yet tried
  // for recompute; -1 if none.
  template <typename OffloadDoneAt>
  int ResidentSwap(int pp, const OffloadDoneAt& offload_done_at) const;
  // Records the SWAP -> RECOMPUTE change of `c` (decisions, lineage, keys).
  TrajectoryStep AcceptSwapToRecompute(int c, int64_t peak_bytes,
                                       double iteration_ms);

  // Refinement after a step; updates `decisions` and `current`, appends the
  // activations returned to RETAIN to `retained_again`.
  void Refine(Decisions& decisions, int just_chosen, SimResult& current,
              std::vector<int>& retained_again) const;

  const Simulator* sim_;
  Options options_;
  // Round state.
  Decisions decisions_;
  std::unique_ptr<Lineage> lineage_;
  std::vector<char> no_swap_, no_recompute_;
  std::vector<int> remaining_;
  std::vector<int> swapped_;
  std::vector<double> replay_ms_;
  Simulator::Options sim_options_;
  SimResult current_, next_;
  bool done_ = false;

  // Incremental rounds.
  bool incremental_ = false;
  std::unique_ptr<IncrementalSimulator> inc_;
  std::unique_ptr<CandidateIndex> swap_index_, recompute_index_;
  std::vector<char> in_remaining_;
  std::vector<double> recompute_key_;
  std::vector<int> swap_rank_;  // index in swapped_
  std::vector<std::pair<int, int>> queued_;
  std::vector<int> refreshed_;
};

// The decisions after the first `steps` steps of a trajectory.
Decisions DecisionsAfter(int activation_count,
                         const std::vector<TrajectoryStep>& trajectory,
                         size_t steps);
// Same, for a trajectory that started from `seed` (MutwoPolicy::Options).
Decisions DecisionsAfter(const Decisions& seed,
                         const std::vector<TrajectoryStep>& trajectory,
                         size_t steps);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_MUTWO_POLICY_H_
