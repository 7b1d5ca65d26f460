// What the schedule compiler (execution_plan.h) reads of a graph's
// aliasing, computed once per schedule and shared by its segments and its
// swaps: which top-level nodes read each alias root, alias.h's readers
// (through views, in-place results and containers) joined with the readers
// through tuples, whose unpacking alias.h does not follow; and which roots
// forward returns.
//
// Points into the Graph it was computed from (torch::jit::Value pointers,
// owned by Graph::graph()): valid while that Graph lives. This header
// includes no LibTorch header. Thread-compatible.
#ifndef MUTWO_WORKER_GRAPH_ALIASING_H_
#define MUTWO_WORKER_GRAPH_ALIASING_H_

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace torch::jit {
struct Value;
}  // namespace torch::jit

namespace mutwo::worker {

class Graph;

struct GraphAliasing {
  // Per alias root: the top-level nodes reading it (through any alias,
  // through the containers it was put in, and through what was taken out
  // of the tuples it was put in), increasing.
  absl::flat_hash_map<const torch::jit::Value*, std::vector<int>>
      readers_of_root;
  // Roots of the values forward returns (read by the loss), those it
  // returns inside tuples and lists included.
  absl::flat_hash_set<const torch::jit::Value*> returned_roots;

  const std::vector<int>& ReadersOf(const torch::jit::Value* root) const {
    static const std::vector<int> kNone;
    auto it = readers_of_root.find(root);
    return it == readers_of_root.end() ? kNone : it->second;
  }
};

// The aliasing facts of `graph`'s top-level nodes and return.
GraphAliasing AnalyzeAliasing(const Graph& graph);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_GRAPH_ALIASING_H_
