// Compiling a v1::Schedule for execution: the one place that turns the
// planner's decisions and the model's IR (graph.h) into what the executor
// runs, once per schedule, before any step: the segments to recompute and
// the swaps to do. Static analysis of the graph only (alias.h and
// graph_aliasing.h: readers through views, in-place results, containers and
// tuples; in-place writes); what the run observes (runtime aliasing, pinned
// storages) is the executor's.
//
// A segment (the planner's Decision.segment) covers the contiguous IR node
// range from the earliest node its members' activations are rebuilt from
// (their `recompute_nodes`, which may start before the first member: nodes
// whose outputs died in forward) to its last member, extended over in-place
// ops that write a member's output right after it (`out += x; relu_(out)`),
// so that what is replayed is the value autograd saved. Groups whose
// lineages overlap are merged; ranges are clipped so that segments never
// overlap. How a segment runs is checkpoint.h's.
//
// A swap moves the producer's output storages to host memory after its last
// forward read (through any alias) and back before its first backward use
// (swap.h); outputs returned by forward are never swapped.
//
// The plan points into the Graph it was compiled from (torch::jit::Value
// pointers, owned by Graph::graph()): it is valid while that Graph lives.
// This header includes no LibTorch header. Thread-compatible.
#ifndef MUTWO_WORKER_EXECUTION_PLAN_H_
#define MUTWO_WORKER_EXECUTION_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"

namespace torch::jit {
struct Value;
}  // namespace torch::jit

namespace mutwo::worker {

class Graph;

// A segment as the executor runs it (static; built once per schedule).
struct SegmentPlan {
  int segment = 0;  // Decision.segment
  int first_node = 0;
  int last_node = 0;
  std::vector<int> members;  // producer nodes of its RECOMPUTE decisions
  int recomputed = 0;        // its RECOMPUTE decisions
  // Values read in the range and defined before it (graph inputs included).
  std::vector<const torch::jit::Value*> inputs;
  // Inputs written in place inside the range or after it: kept as a copy.
  std::vector<bool> copy_input;
  // Attribute paths (from `self`) of tensors read by GetAttr inside the range.
  std::vector<std::vector<std::string>> attribute_paths;
  // Values defined in the range and used after it, then the lists and dicts
  // defined before it that it writes (appends, sets entries) and that are
  // read after it.
  std::vector<const torch::jit::Value*> outputs;
  // Per output: one of those lists or dicts. The forward returns the
  // tensors it added (not the inputs it already held) and writes the
  // container back in place.
  std::vector<bool> container_output;
  // Output storages freed after their last forward use and replayed.
  std::vector<bool> freeable;
  // Per output: the last top-level node reading it or a view / in-place
  // result of it (when its storage can be freed).
  std::vector<int> free_after;
  // Per output: top-level nodes after the range that read it (or a view or
  // in-place result of it); when its storage was freed, their backward
  // needs the replay. Empty for outputs that are not freeable.
  std::vector<std::vector<int>> output_readers;
  // Per output: written in place after the range by a node that is not in
  // `tail` (its forward value is not the one the replay computes).
  std::vector<bool> written_after;
  // Nodes after the range that the replay applies to its outputs, under
  // NoGradGuard, from values captured when they ran in forward: the in-place
  // ops writing a member's output that the range could not be extended over
  // (a node holding an activation comes first: ResNet's downsample before
  // `out += identity; relu_(out)`), and the nodes their other inputs are
  // rebuilt from (the members' `recompute_nodes` after the range). They run
  // normally in forward (autograd records them); the replay only rebuilds the
  // value autograd saved after them.
  std::vector<int> tail;
};

// A SWAP decision as the executor runs it.
struct SwapPlan {
  int value_id = 0;
  int producer = 0;
  int offload_after = 0;  // node after which the storages leave
  // The planner's offload_after: a storage no value of the rest of the
  // forward holds may leave after it, before `offload_after` (whose static
  // readers include every reader of a container it may have been put in).
  int planned_offload_after = 0;
  // Node whose backward starts the copy back (Decision.prefetch_node); -1:
  // the copy starts at the first backward use.
  int prefetch_node = -1;
  std::vector<int> readers;  // top-level nodes reading the output (aliases)
  // Values that hold the swapped storages: the producer's outputs, then the
  // views and in-place results on them up to `offload_after` (a recompute
  // segment keeps its inner values to itself and exposes only those).
  std::vector<const torch::jit::Value*> values;
};

// What the executor runs for one schedule: segments in node order (ranges
// disjoint), swaps in decision order.
struct ExecutionPlan {
  std::vector<SegmentPlan> segments;
  std::vector<SwapPlan> swaps;

  // The segment whose range [first_node, last_node] holds `node` (ranges do
  // not overlap), or -1.
  int SegmentHolding(int node) const {
    for (size_t s = 0; s < segments.size(); ++s) {
      if (segments[s].first_node <= node && node <= segments[s].last_node) {
        return static_cast<int>(s);
      }
    }
    return -1;
  }
};

// Compiles `schedule` for `graph` (the IR the schedule's fingerprint names;
// the caller checks the fingerprint). InvalidArgument names a decision whose
// producer, recompute node or offload point is not a node of `graph`.
[[nodiscard]] absl::StatusOr<ExecutionPlan> CompileSchedule(
    const Graph& graph, const v1::Schedule& schedule);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_EXECUTION_PLAN_H_
