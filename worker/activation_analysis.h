// The profiler's liveness and lineage analysis, as a pure function over
// plain records: which allocations alive at the end of forward are
// activations (by producer node), when each is last read in forward, first
// needed and freed in backward, and what a replay of it would run
// (recompute lineage) and hold (sources). The profiler (profiler.cc) runs
// the training step with LibTorch, records what it saw into these structs
// and turns the answer into v1::Activation messages with its timings; the
// analysis itself runs no LibTorch and is tested on hand-built records
// (tests/worker/activation_analysis_test.cc).
//
// Positions follow types.proto's timeline: forward node i is position i,
// backward step k is position num_nodes + k.
//
// No LibTorch headers (memory.h is torch-free). Thread-compatible.
#ifndef MUTWO_WORKER_ACTIVATION_ANALYSIS_H_
#define MUTWO_WORKER_ACTIVATION_ANALYSIS_H_

#include <cstdint>
#include <vector>

#include "worker/memory.h"

namespace mutwo::worker {

// Static facts about one top-level IR node (graph.h's IrNode and alias.h).
struct LineageNode {
  // Producers of the values the node (or its blocks) reads (sorted, unique).
  std::vector<int> input_nodes;
  // Nodes reading its outputs (sorted, unique).
  std::vector<int> consumers;
  // Largest node id reading an output (IrNode::last_use).
  int last_use = 0;
  // The node itself writes an input in place (alias.h's WritesInPlace).
  bool writes_in_place = false;
  // It reads a list or dict that some node writes in place (alias.h's
  // MutatedContainers): a replay of it would read the container as it is
  // when the replay runs, not as it was in forward.
  bool reads_mutated_container = false;
};

// What one profiled training step observed of memory.
struct StepMemoryRecord {
  // Allocations alive at the end of forward (after the interpreter and the
  // outputs were dropped: held by autograd), tagged with the position that
  // made them (kLossTag: the loss).
  std::vector<LiveBlock> live_at_end_of_forward;
  // Frees logged from the start of backward, in order.
  std::vector<FreeEvent> frees;
  // Per node: the addresses of the storages of its tensor outputs (a view
  // or an in-place result repeats its base's address).
  std::vector<std::vector<uintptr_t>> output_storages;
  // Per node, parallel to output_storages: the index of the node output each
  // address came from. May be empty (then no output indices are reported).
  std::vector<std::vector<int>> output_indices;
  // Per node: every output storage was still alive at the end of forward.
  std::vector<bool> outputs_alive;
  // Per backward step, in execution order: the node whose run created its
  // autograd node (-1: none, e.g. the loss's steps).
  std::vector<int> step_forward_node;
};

// One activation: the live allocations one node made.
struct ActivationRecord {
  int value_id = 0;  // index in ActivationAnalysis::activations
  int producer_node = 0;
  int64_t size_bytes = 0;
  // Bytes not in the producer's output storages (dropout masks, max-pool
  // indices, saved statistics): a swap cannot move them.
  int64_t unswappable_bytes = 0;
  int storages = 0;  // live blocks
  // Outputs of the producer (sorted, unique) whose storages are among the
  // blocks (Activation.output_indices).
  std::vector<int> output_indices;
  // Largest node reading the producer's outputs or the outputs of any node
  // exposing one of its storages (views, in-place results), or a consumer
  // of those.
  int last_forward_use = 0;
  // First backward step (position) mapped to the producer, to a node
  // exposing its storage, or to one of their consumers; at most
  // last_backward_use.
  int first_backward_use = 0;
  // Position during which the allocator freed its last block (blocks freed
  // after backward, or never, count as the last step).
  int last_backward_use = 0;
  // Nodes a replay runs (sorted; the producer among them): walking back
  // from the producer through nodes whose outputs were not kept, plus the
  // in-place writes of its storages after it and their lineage. A kept
  // storage overwritten in place between its producer and the last replayed
  // node does not hold the value the replay reads: its producer is
  // replayed too.
  std::vector<int> recompute_nodes;
  // Activations (value ids, sorted) the replay reads: kept outputs the walk
  // stopped at.
  std::vector<int> recompute_sources;
  // The first of recompute_nodes that reads a mutated list or dict, or -1:
  // then the activation cannot be recomputed.
  int mutated_container_reader = -1;
};

struct ActivationAnalysis {
  // By producer node, increasing.
  std::vector<ActivationRecord> activations;
  // Sum of the activations' sizes.
  int64_t tracked_bytes = 0;
  // Live bytes the loss made (kLossTag).
  int64_t loss_bytes = 0;
};

// `nodes` has one entry per IR node; `step.output_storages` and
// `step.outputs_alive` too. Blocks tagged with neither a forward position
// nor kLossTag (parameters, inputs, backward) are not activations.
ActivationAnalysis AnalyzeActivations(const std::vector<LineageNode>& nodes,
                                      const StepMemoryRecord& step);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_ACTIVATION_ANALYSIS_H_
