#include "worker/graph_aliasing.h"

#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "worker/alias.h"
#include "worker/graph.h"

namespace mutwo::worker {
namespace {

using torch::jit::Node;
using torch::jit::Value;

// The constant index a prim::TupleIndex takes, or -1 when it is computed.
int ConstantTupleIndex(const Node* node) {
  const std::optional<c10::IValue> index = torch::jit::toIValue(node->input(1));
  return index.has_value() && index->isInt() ? static_cast<int>(index->toInt())
                                             : -1;
}

// What ReadersThroughTuples looks up while it follows a tensor: built once
// per graph, read for every tensor put in a tuple.
struct TupleCarriers {
  // Per root: the values sharing its storage (views, in-place results).
  absl::flat_hash_map<const Value*, std::vector<const Value*>> values_of_root;
  absl::flat_hash_set<const Value*> tupled;         // roots put in some tuple
  absl::flat_hash_map<const Node*, int> top_level;  // node -> its IrNode id
};

TupleCarriers IndexTuples(const Graph& graph) {
  TupleCarriers index;
  for (const Value* in : graph.graph()->inputs()) {
    index.values_of_root[AliasRoot(in)].push_back(in);
  }
  for (const IrNode& ir : graph.nodes()) {
    ForEachNested(ir.node, [&](const Node* node) {
      index.top_level[node] = ir.id;
      for (const Value* out : node->outputs()) {
        index.values_of_root[AliasRoot(out)].push_back(out);
      }
      if (node->kind() != c10::prim::TupleConstruct) return;
      for (const Value* in : node->inputs()) {
        if (MayHoldTensor(in->type())) index.tupled.insert(AliasRoot(in));
      }
    });
  }
  return index;
}

// Follows root `start` through the tuples it is put in (see
// ReadersThroughTuples), adding the readers found to `found`; returns
// whether forward returns one of its carriers.
bool FollowThroughTuples(
    const Graph& graph, const TupleCarriers& index,
    const absl::flat_hash_map<const Value*, std::vector<int>>& readers_of_root,
    const Value* start, std::set<int>& found) {
  const Node* ret = graph.graph()->return_node();
  bool is_returned = false;
  // (value, position of `start` in it): an empty position is a value
  // sharing the storage of the tensor found there.
  std::vector<std::pair<const Value*, std::vector<size_t>>> work;
  absl::flat_hash_set<const Value*> seen_roots{start};
  absl::flat_hash_set<const Value*> seen_tuples;
  auto reach_tensor = [&](const Value* value) {
    const Value* root = AliasRoot(value);
    if (!seen_roots.insert(root).second) return;
    if (auto r = readers_of_root.find(root); r != readers_of_root.end()) {
      found.insert(r->second.begin(), r->second.end());
    }
    work.push_back({root, {}});
  };
  work.push_back({start, {}});
  while (!work.empty()) {
    auto [value, position] = std::move(work.back());
    work.pop_back();
    if (position.empty()) {
      // A tensor holding the storage: each value on it that goes into a
      // tuple, or that forward returns.
      auto values = index.values_of_root.find(value);
      if (values == index.values_of_root.end()) continue;
      for (const Value* v : values->second) {
        for (const torch::jit::Use& use : v->uses()) {
          if (use.user == ret) is_returned = true;
          if (use.user->kind() == c10::prim::TupleConstruct) {
            work.push_back({use.user->output(), {use.offset}});
          }
        }
      }
      continue;
    }
    if (!seen_tuples.insert(value).second) continue;
    const size_t first = position.front();
    const std::vector<size_t> rest(position.begin() + 1, position.end());
    auto take = [&](const Value* taken) {
      if (rest.empty()) {
        reach_tensor(taken);
      } else {
        work.push_back({taken, rest});
      }
    };
    for (const torch::jit::Use& use : value->uses()) {
      const Node* user = use.user;
      if (user == ret) is_returned = true;
      // (Whatever reads a tuple holding the tensor holds it too.)
      if (auto it = index.top_level.find(user); it != index.top_level.end()) {
        found.insert(it->second);
      }
      if (user->kind() == c10::prim::TupleUnpack) {
        if (first < user->outputs().size()) take(user->output(first));
      } else if (user->kind() == c10::prim::TupleIndex) {
        const int at = ConstantTupleIndex(user);
        if (at < 0 || static_cast<size_t>(at) == first) {
          take(user->output());
        }
      } else if (user->kind() == c10::prim::TupleConstruct) {
        std::vector<size_t> deeper{use.offset};
        deeper.insert(deeper.end(), position.begin(), position.end());
        work.push_back({user->output(), std::move(deeper)});
      }
    }
  }
  return is_returned;
}

// A tensor put in a tuple is read by the nodes that read what is taken out
// of it. prim::TupleConstruct has no schema (alias.h joins its inputs and
// output in one container class), but prim::TupleUnpack and
// prim::TupleIndex have one, `(Any tup) -> ...`, without alias annotation:
// what they return is a value of its own there, and the nodes reading it
// were not readers of the tensor (Hugging Face's traced T5 layer norm
// returns (x.to(float32), normed), which the feed-forward unpacks into its
// linear: the segment ending at the norm freed its output after the
// TupleConstruct, and the replay hook went on that node, which makes no
// autograd node, not on the linear that saved the tensor). Follows each
// tensor's root through every tuple it is put in (nested ones included) to
// the values unpacked at its position, and through those to the tuples
// they are put in again; the nodes reading a tuple that holds it read it
// too. Returns, per such root, the readers found that way, and in `returned`
// the roots some of whose carriers forward returns.
absl::flat_hash_map<const Value*, std::set<int>> ReadersThroughTuples(
    const Graph& graph,
    const absl::flat_hash_map<const Value*, std::vector<int>>& readers_of_root,
    absl::flat_hash_set<const Value*>* returned) {
  const TupleCarriers index = IndexTuples(graph);
  absl::flat_hash_map<const Value*, std::set<int>> extra;
  for (const Value* start : index.tupled) {
    if (FollowThroughTuples(graph, index, readers_of_root, start,
                            extra[start])) {
      returned->insert(start);
    }
  }
  return extra;
}

// The roots of `value` and, when it is a tuple or list built in the graph,
// of what was put in it (at any depth).
void InsertRootsOf(const Value* value,
                   absl::flat_hash_set<const Value*>* roots) {
  roots->insert(AliasRoot(value));
  const Node* node = value->node();
  if (node->kind() == c10::prim::TupleConstruct ||
      node->kind() == c10::prim::ListConstruct) {
    for (const Value* in : node->inputs()) InsertRootsOf(in, roots);
  }
}

}  // namespace

GraphAliasing AnalyzeAliasing(const Graph& graph) {
  GraphAliasing aliasing;
  aliasing.readers_of_root = ReadersByRoot(graph);
  for (const Value* v : graph.graph()->return_node()->inputs()) {
    InsertRootsOf(v, &aliasing.returned_roots);
  }
  for (auto& [root, more] : ReadersThroughTuples(
           graph, aliasing.readers_of_root, &aliasing.returned_roots)) {
    if (more.empty()) continue;
    std::vector<int>& readers = aliasing.readers_of_root[root];
    more.insert(readers.begin(), readers.end());
    readers.assign(more.begin(), more.end());
  }
  return aliasing;
}

}  // namespace mutwo::worker
