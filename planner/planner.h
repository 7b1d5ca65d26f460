// The planner facade: one profile, one policy, many budgets. Resolves the
// decisions of a policy for a budget in bytes, says whether they fit and what
// the lowest reachable peak (the floor) is, and sweeps budgets for the
// Pareto curve. All predictions come from the Simulator.
//
// μ-TWO. Budget-independent Algorithm B trajectories ("tracks") are run
// once each, down to their floor: the paper's (largest recompute ratio
// first, swaps allowed); on small graphs a cheapest-first one; when the
// profile can swap, a recompute-only one (swaps chosen by the paper's
// estimate can stall and, once prefetched, hold the peak); and tracks that
// start from the fixed checkpointing schedules (sqrt_n, per_block): the
// schedule itself is the track's first state, so the floor is never above
// a baseline's peak and a plan is never slower than a baseline that fits.
// On small graphs the greedy continues from each of them (with refinement
// only from the one with the lower peak), on large graphs only from that
// one.
//
// Small graphs: each accepted step is followed by refinement (earlier
// choices that are no longer needed go back to RETAIN). A candidate plan
// for budget b takes, in each track, the first state that fits b, then
// improves it for b: pruning (a choice whose removal still fits b without
// adding time goes back to RETAIN) and exchange (a recomputation replaced by
// a cheaper one that still fits). The answer for b is the cheapest candidate
// over b and every tighter budget at which the candidate changes (the
// procedure only depends on b through "peak <= b" tests, so these budgets
// are found exactly, one below the highest peak each candidate relied on).
// Hence a tighter budget never gives a lower predicted time.
//
// Large graphs (more than Options::small_graph_activations activations):
// no refinement, rounds on the incremental simulator (Options::incremental),
// and the plan is the fastest (full time model) of the tracks' first states
// that fit (Algorithm B's stop in each); the search is bounded by
// simulations per candidate and envelope probes on small graphs, and
// PlanResult says when a bound was hit.
//
// Not thread-safe (the simulator has scratch buffers): one Planner per
// request or per thread.
#ifndef MUTWO_PLANNER_PLANNER_H_
#define MUTWO_PLANNER_PLANNER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/interrupt.h"
#include "planner/model.h"
#include "planner/mutwo_policy.h"
#include "planner/pareto.h"
#include "planner/simulator.h"

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
  // Options::interrupt stopped the search: the result is not to be used.
  bool interrupted = false;
};

class Planner {
 public:
  struct Options {
    Policy policy = Policy::kMutwo;
    bool allow_swap = true;  // μ-TWO only
    // Keep the per-position memory curves in PlanResult::sim.
    bool record_curve = false;
    // μ-TWO effort bounds.
    int small_graph_activations = 256;
    int64_t max_improve_simulations = 400;  // per candidate
    int max_probes = 64;                    // candidates per Plan()
    // Large graphs: run the trajectory to the floor for every plan (for
    // PlanResult::floor_bytes); off, only as far as the budget needs, and
    // floor_bytes is 0 unless the budget is infeasible.
    bool compute_floor = true;
    // Large graphs: rounds on the incremental simulator
    // (MutwoPolicy::Options::incremental); off, every round re-simulates
    // the whole timeline (the reference; the same trajectory, slower).
    bool incremental = true;
    // Model what the executor recomputes without being told
    // (replay_closure.h): in the final plan, and on large graphs in the
    // choice of the first fitting state. Off: the decisions as searched.
    bool close_over_replays = true;
    // When set (not owned; must outlive the Planner), polled by every loop:
    // once it stops, trajectories end where they are, no more candidates
    // are tried, and PlanResult::interrupted is set.
    Interrupt* interrupt = nullptr;
  };

  // Errors: InvalidArgument for an inconsistent profile (Simulator::Create);
  // the interrupt's status when it stopped the build of a trajectory.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Planner>> Create(
      PlanProfile profile, Options options);

  PlanResult Plan(int64_t budget_bytes);
  // Non-dominated points of a sweep of `points` budgets from the floor to
  // the baseline peak, plus (μ-TWO) the peaks of the fixed schedules the
  // seeded trajectories start from.
  std::vector<ParetoPoint> Pareto(int points);
  int64_t FloorBytes();

  const PlanProfile& profile() const { return profile_; }
  const Simulator& simulator() const { return *sim_; }
  const Options& options() const { return options_; }
  // μ-TWO trajectory `order` down to the floor (see Options for the list;
  // 0 is always the paper's). On large graphs its steps are timed without
  // prefetch stalls. Orders that start from a seed (a baseline schedule)
  // start from the sqrt_n and per_block schedules.
  const std::vector<TrajectoryStep>& Trajectory(int order = 0);
  int trajectories() const { return orders(); }

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
  bool Interrupted() {
    return options_.interrupt != nullptr && options_.interrupt->Stopped();
  }
  // Improves `decisions` (fitting `budget_bytes`) by pruning and exchange.
  void Improve(int64_t budget_bytes, Candidate& c);

  // A candidate improved for `budget_bytes` (small graphs).
  struct Improved {
    int64_t budget_bytes = 0;
    Candidate candidate;
  };
  // One μ-TWO trajectory: its policy, the state it starts from (the seed),
  // the steps taken so far and the candidates improved from its states.
  struct Track {
    std::unique_ptr<MutwoPolicy> policy;
    Decisions seed;
    int64_t seed_peak_bytes = 0;
    std::vector<TrajectoryStep> steps;
    bool exhausted = false;
    std::vector<Improved> improved;
  };
  int orders() const { return static_cast<int>(tracks_.size()); }
  // Peak of state `index` of a track: -1 is the seed, i the state after
  // step i.
  int64_t StatePeak(const Track& track, int index) const {
    return index < 0 ? track.seed_peak_bytes : track.steps[index].peak_bytes;
  }
  Decisions StateDecisions(const Track& track, int index) const {
    return DecisionsAfter(track.seed, track.steps, index + 1);
  }
  // The first state of track `order` whose peak is at most `budget_bytes`
  // (extending the trajectory as far as needed); -2 when none.
  int FirstFit(int order, int64_t budget_bytes);
  // Large graphs: the first state of track `order`, up to FirstFit's, whose
  // peak with what the executor recomputes anyway (replay_closure.h) is at
  // most `budget_bytes`, by bisection (that peak falls along a trajectory
  // as the plain one does; the state found fits either way); -2 when none.
  int ClosedFirstFit(int order, int64_t budget_bytes);
  // Memory-only peak of a state's decisions closed over their replays.
  int64_t ClosedPeak(int order, int index);

  PlanProfile profile_;
  Options options_;
  bool small_ = true;
  std::unique_ptr<Simulator> sim_;
  // Extends trajectory `order` until a state's peak is at most `peak_bytes`
  // or the policy has no candidate left.
  void Extend(int order, int64_t peak_bytes);

  std::vector<Track> tracks_;
  // Large graphs: iteration time (full time model) of trajectory states
  // already timed, by (order, state index).
  std::map<std::pair<int, int>, double> timed_ms_;
  std::map<std::pair<int, int>, int64_t> closed_peak_;
  std::optional<SimResult> fixed_;  // the baselines' single schedule
  Decisions fixed_decisions_;
};

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_PLANNER_H_
