// The memory and time simulator (μ-TWO Algorithm G plus a time model): a pure
// function of (profile, decisions) that re-simulates the whole timeline.
//
// Memory. planned(t) = measured(t) - bytes of activations the plan has
// released at t + bytes it holds longer than the baseline (segment inputs,
// swap buffers in flight, prefetched tensors). Each activation occupies the
// positions [producer, last_backward_use] in the baseline; the plan replaces
// that interval by its own residency intervals:
//  - RETAIN: unchanged, extended while a recompute segment keeps it as input.
//  - RECOMPUTE: maximal runs of recompute producer nodes (node-id order,
//    non-op nodes ignored) form segments; a segment keeps only its inputs
//    (recompute sources outside the segment) and replays all its
//    recompute_nodes once, before the earliest first backward use among its
//    activations. Its activations are resident [producer, last_forward_use]
//    and [replay position, last_backward_use].
//  - SWAP: offloaded after last_forward_use on one device->host stream (the
//    memory is freed at the position where the copy completes) and
//    prefetched on one host->device stream from `prefetch_at` (the buffer is
//    allocated there) so that it is resident at its first backward use.
// The peak is taken over the per-position high-water marks.
//
// Time. iteration = baseline iteration + segment replay time + stalls, where
// a stall is prefetch time not hidden behind the compute (including replays)
// between prefetch_at and first use, with transfers queued on one stream.
//
// Thread safety: a Simulator keeps scratch buffers; use one per thread.
#ifndef MUTWO_PLANNER_SIMULATOR_H_
#define MUTWO_PLANNER_SIMULATOR_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"

namespace mutwo::planner {

struct SimResult {
  int64_t peak_bytes = 0;
  int peak_position = 0;
  double iteration_ms = 0;
  double recompute_ms = 0;
  double stall_ms = 0;
  int recomputed = 0;
  int swapped = 0;
  int segments = 0;
  // Per activation: recompute segment (-1 if none), position before which
  // it is rebuilt or must be prefetched (-1), offload completion position
  // for swaps (-1), stall attributed to its prefetch, and its segment's
  // replay time.
  std::vector<int> segment_of;
  std::vector<int> needed_at;
  std::vector<int> offload_done_at;
  std::vector<double> stall_ms_of;
  std::vector<double> segment_ms_of;
  // Per segment: (replay position, replay time).
  std::vector<std::pair<int, double>> replays;
  // False when Options::time_model was off: stall_ms is 0 and iteration_ms
  // counts recompute time only.
  bool timed = true;
  // Planned high-water mark during each position (always filled).
  std::vector<int64_t> planned_peak_bytes;
  // Filled when Options::record_curve: bytes after each position, baseline
  // and planned; the baseline high-water mark during each position; the end
  // of each position in the baseline step and in the planned step (stalls
  // and replays before the position's own step), from the step's start.
  std::vector<int64_t> baseline_after_bytes;
  std::vector<int64_t> planned_after_bytes;
  std::vector<int64_t> baseline_during_bytes;
  std::vector<double> baseline_end_ms;
  std::vector<double> planned_end_ms;
};

// The structural invariants the simulator relies on (last_forward_use a
// forward position, first_backward_use a backward one, uses ordered,
// recompute nodes increasing, ids that exist). One check for every way a
// profile reaches the planner: Simulator::Create runs it, and so does
// ProfileFromProto (proto_convert.h), so a profile the server takes from a
// worker is checked by the same code. InvalidArgument naming the field as
// v1::Profile does: `activations[2] (value_id 7).producer_node = 9: ...`.
[[nodiscard]] absl::Status ValidatePlanProfile(const PlanProfile* profile);

class Simulator {
 public:
  struct Options {
    bool record_curve = false;
    // Off: memory only (Algorithm G), no prefetch-stall walk; the policy's
    // inner loop on large graphs.
    bool time_model = true;
  };

  // Errors: InvalidArgument for a profile whose positions or ids are out of
  // range (ValidatePlanProfile).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Simulator>> Create(
      const PlanProfile* profile);

  // `decisions` must have one entry per activation.
  SimResult Run(const Decisions& decisions, Options options) const;
  SimResult Run(const Decisions& decisions) const {
    return Run(decisions, Options{});
  }
  // Same, reusing `out`'s buffers (the planner's hot loop).
  void Run(const Decisions& decisions, Options options, SimResult* out) const;

  const PlanProfile& profile() const { return *profile_; }
  int positions() const { return positions_; }
  int64_t baseline_peak_bytes() const { return baseline_peak_bytes_; }
  double baseline_iteration_ms() const { return baseline_iteration_ms_; }
  double step_ms(int position) const { return step_ms_[position]; }
  // End time of `position` in the baseline step (forward from 0).
  double baseline_end_ms(int position) const { return end_ms_[position]; }
  const std::vector<double>& baseline_end_times_ms() const { return end_ms_; }
  double transfer_in_ms(const PlanActivation& a) const;
  double transfer_out_ms(const PlanActivation& a) const;
  // Baseline high-water mark during each position.
  const std::vector<int64_t>& baseline_during_bytes() const {
    return base_during_;
  }
  // Bytes an op allocates only while it runs (PlanNode.transient_bytes: a
  // cuDNN workspace, a temporary). A replay runs the op again with the
  // segment's outputs so far resident: its transient adds there.
  int64_t replay_transient_bytes(int node) const {
    return node_transient_[node];
  }
  // The most a replay reaches above all its members' bytes: an op runs
  // with the members made before it (and its own) resident, its transient
  // on top. The executor replays the whole node range from the first node
  // replayed to the last member, so what the plain forward held at most
  // over that range (values no member is, dying inside it: the windowing
  // before Swin's attention; retained activations the range makes again)
  // bounds it from below too. `members`: (producer node, bytes) of the
  // RECOMPUTE activations (sorted here); `nodes`: the nodes replayed,
  // sorted (as ReplayMs takes them).
  int64_t ReplayTransient(std::vector<std::pair<int, int64_t>>& members,
                          const std::vector<int>& nodes) const;
  // The time of a replay: the executor runs every node from the first one
  // replayed to the last (lineage, members, and what lies between: views,
  // Swin's window partition). The device's time for that range, or the
  // host's where launching it takes longer (small ops on a fast device:
  // the device waits), plus the host cost of the replay mechanism per
  // segment (its autograd function's nested backward). `nodes`: the nodes
  // replayed, sorted.
  double ReplayMs(const std::vector<int>& nodes) const {
    if (nodes.empty()) return 0;
    const double device = forward_ms_before_[nodes.back() + 1] -
                          forward_ms_before_[nodes.front()];
    const double host =
        host_ms_before_[nodes.back() + 1] - host_ms_before_[nodes.front()];
    return std::max(device, host) + profile_->replay_overhead_ms;
  }
  // What a replay's transient adds at `position`: the replay runs before
  // the backward step there, so the step's own transient (above the memory
  // before it) is not on top of it; the excess is.
  int64_t replay_transient_excess(int64_t transient, int position) const {
    const int64_t headroom =
        position > 0 ? base_during_[position] - base_after_[position - 1] : 0;
    return std::max<int64_t>(0, transient - std::max<int64_t>(0, headroom));
  }
  // Op nodes in id order, and the activations each node produced.
  const std::vector<int>& op_nodes() const { return op_nodes_; }
  const std::vector<int>& produced_by(int node) const {
    return produced_by_[node];
  }
  // True when the baseline end times never decrease (step times >= 0, as
  // proto_convert enforces); the incremental policy relies on it.
  bool monotone_time() const { return monotone_time_; }

 private:
  explicit Simulator(const PlanProfile* profile);

  const PlanProfile* profile_;
  int positions_ = 0;
  int nodes_ = 0;
  std::vector<int64_t> base_after_;
  std::vector<int64_t> base_during_;
  std::vector<double> step_ms_;
  std::vector<double> end_ms_;
  std::vector<int> op_nodes_;
  std::vector<int64_t> node_transient_;
  // forward_ms_before_[k] / host_ms_before_[k]: the forward time / host
  // time of nodes [0, k).
  std::vector<double> forward_ms_before_;
  std::vector<double> host_ms_before_;
  // Sparse table of base_during_ over forward positions (range maxima);
  // empty without allocator figures.
  std::vector<std::vector<int64_t>> forward_during_max_;
  int64_t ForwardDuringMax(int first, int last) const;
  std::vector<std::vector<int>> produced_by_;  // node -> activations
  std::vector<int> by_last_forward_use_;       // activation order
  int64_t baseline_peak_bytes_ = 0;
  double baseline_iteration_ms_ = 0;
  bool monotone_time_ = true;

  // Run's phases, in order. Each reads what the ones before it left in the
  // scratch vectors below and in `r`.
  // Recompute segments (maximal runs of recomputed op nodes) and their
  // replay positions and times.
  void BuildSegments(const Decisions& decisions, SimResult& r) const;
  // How long each segment's inputs stay resident (until its replay).
  void HoldSegmentInputs(SimResult& r) const;
  // Offloads queued on the one device->host stream; prefetch positions.
  void QueueSwaps(const Decisions& decisions, SimResult& r) const;
  // The memory curve with the plan's residency intervals; the peak.
  void SimulateMemory(const Decisions& decisions, Options options,
                      SimResult& r) const;
  // Stalls: the timeline walked with one host->device stream (swaps only).
  void WalkTime(SimResult& r) const;
  // The baseline and planned end times per position (record_curve).
  void RecordTimeline(SimResult& r) const;

  // Scratch, reused by Run.
  mutable std::vector<int64_t> scratch_delta_after_;
  mutable std::vector<int64_t> scratch_delta_during_;
  mutable std::vector<int> scratch_node_stamp_;
  mutable std::vector<int> scratch_hold_until_;
  mutable std::vector<int> scratch_first_need_;
  mutable std::vector<int> scratch_swaps_;
  mutable std::vector<double> scratch_offload_done_ms_;
  mutable std::vector<int> scratch_prefetch_at_;
  struct Segment {
    int replay_at = 0;
    double ms = 0;
    std::vector<std::pair<int, int64_t>> members;  // (producer, bytes)
    std::vector<int> nodes;                        // replayed
  };
  mutable std::vector<Segment> scratch_segments_;
  mutable int stamp_base_ = 0;
};

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_SIMULATOR_H_
