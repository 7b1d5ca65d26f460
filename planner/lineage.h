// Lineage: the recompute lineage the μ-TWO policy keeps while it chooses
// (Algorithms D, E, F of the paper's Appendix B): per activation, the
// sources a recomputation rebuilds it from, the recompute time of one
// rebuild, and the total over the times it would be rebuilt (once for
// itself, once more per chosen recomputation that needs it as a source).
// Owned by MutwoPolicy; reads the Simulator's profile, which must outlive
// it. Not thread-safe.
#ifndef MUTWO_PLANNER_LINEAGE_H_
#define MUTWO_PLANNER_LINEAGE_H_

#include <vector>

#include "planner/simulator.h"

namespace mutwo::planner {

class Lineage {
 public:
  // Where an activation stands in the policy: still a candidate, chosen
  // for recompute or swap, or never to be chosen (empty, not recomputable,
  // not an op, or returned to RETAIN for good).
  enum class State { kCandidate, kRecomputed, kSwapped, kNever };

  explicit Lineage(const Simulator& sim);

  State state(int c) const { return state_[c]; }
  // Receives every candidate whose total is recomputed (or nullptr).
  void TrackRefreshed(std::vector<int>* refreshed) { refreshed_ = refreshed; }
  // `c` went back to RETAIN for good: no longer a chosen recomputation.
  void Forget(int c);
  double total(int c) const { return total_[c]; }

  // Algorithm E then F for `t` chosen for recompute. `refresh` off leaves
  // the totals stale (a seed of many recomputations: RefreshAll() once
  // after them gives the same totals).
  void Recompute(int t, bool refresh = true);

  // A swapped activation `t` rebuilt by recomputation instead: it counts as
  // a chosen recomputation of its sources from now on. (Its users' sources
  // are not rewritten: E/F ran for the swap.)
  void SwapToRecompute(int t);

  void RefreshAll();

  // Algorithm F lines 2-9 for `t` chosen for swap: a candidate whose first
  // backward use falls outside t's backward interval can no longer use t.
  void Swap(int t);

 private:
  bool HasSource(int u, int s) const;

  // u's source t is replaced by t's sources (a sorted merge). Sources and
  // users are only ever looked up for candidates (HasSource(u, c) when c is
  // chosen; users_[c] likewise; chosen_users_[c]), an activation that
  // stops being a candidate never becomes one again, and a candidate never
  // leaves a source list: so both lists keep candidates only, which keeps
  // them short without changing any answer.
  void Replace(int u, int t);

  // total = time × (1 + chosen recomputations that rebuild it as a source).
  void RefreshTotal(int c);

  const Simulator& sim_;
  std::vector<std::vector<int>> srcs_;
  std::vector<std::vector<int>> users_;
  std::vector<double> time_;
  std::vector<double> total_;
  std::vector<State> state_;
  // Per activation: chosen recomputations that have it as a source (kept
  // up to date on every change of a state or of a chosen one's sources).
  std::vector<int> chosen_users_;
  std::vector<int>* refreshed_ = nullptr;
  std::vector<int> merged_;  // scratch for Replace
};

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_LINEAGE_H_
