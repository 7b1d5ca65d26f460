// An exact incremental form of the simulator's memory model (Algorithm G)
// for the policy's inner loop on large graphs: decisions change one
// activation at a time, and only what that change can affect is re-derived.
//
// Every activation's contribution to the planned curve (its baseline
// interval replaced by the plan's residency intervals, see simulator.h) is
// a pure function of its own derived state: action, recompute segment and
// its replay position, the latest replay of a segment holding it as input,
// offload completion and prefetch position. A change of one decision
// re-derives that state for the activations it can touch:
//  - RECOMPUTE on/off: the segments around the producer node (created,
//    extended, merged or split), their members and the members' recompute
//    sources (segment inputs are held until the replay);
//  - SWAP on/off: the offloads queued after it on the device->host stream,
//    up to the first whose completion time is unchanged;
// and replaces exactly those contributions in a segment tree over positions
// (range add, maximum with its leftmost position). The tree always holds the
// baseline high-water marks plus the sum of the current contributions, so
// peak, peak position and per-position marks equal Simulator::Run's on the
// same decisions (tests/planner/incremental_simulator_test.cc checks this
// after every change against the full re-simulation, which stays the
// reference everywhere else).
//
// Time: iteration_ms() is the memory-only time model (baseline + replay
// time, no prefetch stalls), equal to Simulator::Run with time_model off,
// summed in the same order.
//
// Thread safety: none; one per policy.
#ifndef MUTWO_PLANNER_INCREMENTAL_SIMULATOR_H_
#define MUTWO_PLANNER_INCREMENTAL_SIMULATOR_H_

#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/simulator.h"

namespace mutwo::planner {

class IncrementalSimulator {
 public:
  // Errors: InvalidArgument for a null simulator.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<IncrementalSimulator>>
  Create(const Simulator* simulator);

  // Back to "retain everything".
  void Reset();
  // Changes one activation's decision and re-derives what it affects.
  void Set(int activation, Decision decision);

  const Decisions& decisions() const { return decisions_; }
  int64_t peak_bytes() const;
  // Leftmost position of the peak (as Simulator::Run reports it).
  int peak_position() const;
  // Planned high-water mark during `position`; O(log positions).
  int64_t planned_peak_bytes(int position) const;
  // Sum of the replay times of the segments replayed at `position`.
  double replay_ms_at(int position) const { return replay_ms_[position]; }
  // As SimResult::needed_at / offload_done_at (-1 when not applicable).
  int needed_at(int activation) const;
  int offload_done_at(int activation) const;
  // SWAP activations whose prefetch must complete before `position`.
  const std::vector<int>& swaps_needed_at(int position) const {
    return swaps_needed_at_[position];
  }
  int segments() const { return static_cast<int>(run_starts_.size()); }
  // Replay time of all segments, summed in segment order (O(segments) after
  // a segment changed, cached otherwise).
  double recompute_ms() const;
  // Baseline + replay time (no stalls).
  double iteration_ms() const;

 private:
  explicit IncrementalSimulator(const Simulator* simulator);

  // Max segment tree with range add over the positions.
  void TreeAdd(int begin, int end, int64_t bytes);
  void TreeAdd(int node, int lo, int hi, int begin, int end, int64_t bytes);

  // The maximal intervals of constant non-zero change over the baseline
  // (at most 5: three intervals have at most 6 end points).
  struct Contribution {
    int count = 0;
    int begin[5] = {};
    int end[5] = {};
    int64_t bytes[5] = {};
    bool operator==(const Contribution& o) const;
  };
  Contribution Derive(int activation);

  // Recompute segments as runs over the op nodes that produced activations
  // (indexed k); a run is keyed by its first k.
  int RunContaining(int k) const;
  void DetachRun(int start);
  void AttachRun(int start, int end);
  void UpdateReplayMs(int position);
  void UpdateOffloads(std::set<std::pair<int, int>>::iterator from, int forced);

  void MarkDirty(int activation);
  void MarkHoldDirty(int activation);
  void MarkSourcesHoldDirty(int activation);

  const Simulator* sim_;
  const PlanProfile* prof_;
  int positions_ = 0;
  int tree_size_ = 1;
  std::vector<int64_t> tree_max_;  // max of the subtree, lazies included
  std::vector<int64_t> tree_add_;  // pending add over the whole subtree

  Decisions decisions_;
  std::vector<std::vector<int>> users_;  // activation -> its recompute users
  std::vector<int> k_of_node_;           // -1: cannot join a segment
  std::vector<int> node_of_k_;
  std::vector<int> recompute_count_;  // per k: RECOMPUTE activations
  std::vector<int> run_starts_;       // sorted
  mutable double recompute_ms_ = 0;
  mutable bool recompute_ms_valid_ = false;
  std::vector<int> run_end_, run_replay_;
  std::vector<double> run_ms_;
  std::vector<int64_t> run_transient_;         // in the tree at run_replay_
  std::vector<std::vector<int>> replay_runs_;  // position -> run starts
  std::vector<double> replay_ms_;
  std::vector<int> seg_key_;  // activation -> run start, -1
  std::vector<int> hold_, first_need_;
  std::set<std::pair<int, int>> swap_order_;  // (last_forward_use, index)
  std::vector<double> offload_done_ms_;
  std::vector<int> offload_done_at_, prefetch_at_;
  std::vector<std::vector<int>> swaps_needed_at_;  // position -> swaps
  std::vector<int> registered_need_;               // where listed there, -1
  std::vector<Contribution> applied_;

  // Activations to re-derive after a change (deduplicated by stamps).
  std::vector<int> dirty_, hold_dirty_;
  std::vector<uint32_t> dirty_stamp_, hold_stamp_, node_stamp_;
  uint32_t stamp_ = 0;
  uint32_t node_stamp_counter_ = 0;
};

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_INCREMENTAL_SIMULATOR_H_
