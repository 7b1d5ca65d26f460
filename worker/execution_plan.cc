#include "worker/execution_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/alias.h"
#include "worker/graph.h"

namespace mutwo::worker {
namespace {

using torch::jit::Node;
using torch::jit::Value;

// What segments and swaps both read of the graph's aliasing, computed once
// per schedule.
struct GraphAliasing {
  // Per alias root: the top-level nodes reading it (through any alias,
  // through the containers it was put in, and through what was taken out
  // of the tuples it was put in), increasing.
  absl::flat_hash_map<const Value*, std::vector<int>> readers_of_root;
  // Roots of the values forward returns (read by the loss), those it
  // returns inside tuples and lists included.
  absl::flat_hash_set<const Value*> returned_roots;

  const std::vector<int>& ReadersOf(const Value* root) const {
    static const std::vector<int> kNone;
    auto it = readers_of_root.find(root);
    return it == readers_of_root.end() ? kNone : it->second;
  }
};

// The constant index a prim::TupleIndex takes, or -1 when it is computed.
int ConstantTupleIndex(const Node* node) {
  const std::optional<c10::IValue> index = torch::jit::toIValue(node->input(1));
  return index.has_value() && index->isInt() ? static_cast<int>(index->toInt())
                                             : -1;
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
  const Node* ret = graph.graph()->return_node();
  // Per root: the values sharing its storage (views, in-place results).
  absl::flat_hash_map<const Value*, std::vector<const Value*>> values_of_root;
  absl::flat_hash_set<const Value*> tupled;         // roots put in some tuple
  absl::flat_hash_map<const Node*, int> top_level;  // node -> its IrNode id
  for (const Value* in : graph.graph()->inputs()) {
    values_of_root[AliasRoot(in)].push_back(in);
  }
  for (const IrNode& ir : graph.nodes()) {
    ForEachNested(ir.node, [&](const Node* node) {
      top_level[node] = ir.id;
      for (const Value* out : node->outputs()) {
        values_of_root[AliasRoot(out)].push_back(out);
      }
      if (node->kind() != c10::prim::TupleConstruct) return;
      for (const Value* in : node->inputs()) {
        if (MayHoldTensor(in->type())) tupled.insert(AliasRoot(in));
      }
    });
  }
  auto readers_of = [&](const Value* root) -> const std::vector<int>& {
    static const std::vector<int> kNone;
    auto it = readers_of_root.find(root);
    return it == readers_of_root.end() ? kNone : it->second;
  };

  absl::flat_hash_map<const Value*, std::set<int>> extra;
  for (const Value* start : tupled) {
    std::set<int>& found = extra[start];
    bool is_returned = false;
    // (value, position of `start` in it): an empty position is a value
    // sharing the storage of the tensor found there.
    std::vector<std::pair<const Value*, std::vector<size_t>>> work;
    absl::flat_hash_set<const Value*> seen_roots{start};
    absl::flat_hash_set<const Value*> seen_tuples;
    auto reach_tensor = [&](const Value* value) {
      const Value* root = AliasRoot(value);
      if (!seen_roots.insert(root).second) return;
      const std::vector<int>& r = readers_of(root);
      found.insert(r.begin(), r.end());
      work.push_back({root, {}});
    };
    work.push_back({start, {}});
    while (!work.empty()) {
      auto [value, position] = std::move(work.back());
      work.pop_back();
      if (position.empty()) {
        // A tensor holding the storage: each value on it that goes into a
        // tuple, or that forward returns.
        for (const Value* v : values_of_root[value]) {
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
        if (auto it = top_level.find(user); it != top_level.end()) {
          found.insert(it->second);
        }
        if (user->kind() == c10::prim::TupleUnpack) {
          if (first < user->outputs().size()) take(user->output(first));
        } else if (user->kind() == c10::prim::TupleIndex) {
          const int index = ConstantTupleIndex(user);
          if (index < 0 || static_cast<size_t>(index) == first) {
            take(user->output());
          }
        } else if (user->kind() == c10::prim::TupleConstruct) {
          std::vector<size_t> deeper{use.offset};
          deeper.insert(deeper.end(), position.begin(), position.end());
          work.push_back({user->output(), std::move(deeper)});
        }
      }
    }
    if (is_returned) returned->insert(start);
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

// The attribute path of a GetAttr chain rooted at `self`; empty if the
// chain starts anywhere else.
std::vector<std::string> AttributePath(const Node* get_attr,
                                       const Value* self) {
  std::vector<std::string> path;
  const Node* node = get_attr;
  while (true) {
    path.push_back(node->s(c10::attr::name));
    const Value* object = node->input(0);
    if (object == self) break;
    if (object->node()->kind() != c10::prim::GetAttr) return {};
    node = object->node();
  }
  std::reverse(path.begin(), path.end());
  return path;
}

// Groups the schedule's RECOMPUTE decisions into segments (by
// Decision.segment). InvalidArgument names a decision whose producer or
// recompute node is not a node of `graph`.
absl::StatusOr<std::vector<SegmentPlan>> PlanSegments(
    const Graph& graph, const GraphAliasing& aliasing,
    const v1::Schedule& schedule) {
  const int n = graph.num_nodes();
  struct Group {
    std::set<int> members, nodes;
    int recomputed = 0;
  };
  std::map<int, Group> groups;
  std::set<int> producers;          // nodes holding an activation (any action)
  std::map<int, int> decisions_of;  // node -> its RECOMPUTE decisions
  for (int i = 0; i < schedule.decisions_size(); ++i) {
    const v1::Decision& d = schedule.decisions(i);
    auto bad_node = [&](int node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decisions[", i, "] (value_id ", d.value_id(), "): node ", node,
          " is not a node of the model's graph (", n, " nodes)"));
    };
    if (d.producer_node() < 0 || d.producer_node() >= n) {
      return bad_node(d.producer_node());
    }
    producers.insert(d.producer_node());
    if (d.action() != v1::Decision::RECOMPUTE) continue;
    Group& g = groups[d.segment()];
    ++decisions_of[d.producer_node()];
    g.members.insert(d.producer_node());
    g.nodes.insert(d.producer_node());
    ++g.recomputed;
    for (int rn : d.recompute_nodes()) {
      if (rn < 0 || rn >= n) return bad_node(rn);
      g.nodes.insert(rn);
    }
  }
  std::vector<std::pair<int, int>> order;  // (first member, segment)
  for (const auto& [segment, g] : groups) {
    order.push_back({*g.members.begin(), segment});
  }
  std::sort(order.begin(), order.end());

  const Value* self = graph.graph()->inputs()[0];
  const Node* ret = graph.graph()->return_node();
  // Per node: roots it writes in place.
  std::vector<std::vector<const Value*>> writes(n);
  for (const IrNode& ir : graph.nodes()) {
    ForEachWritten(ir.node, [&](const Value* v) {
      writes[ir.id].push_back(AliasRoot(v));
    });
  }

  // Groups whose replays overlap (a later group rebuilds its activations
  // from nodes inside an earlier group's range: GPT's attention output from
  // the q/k/v a previous group replays) run as one segment. Clipping the
  // later range instead would make it read the earlier group's outputs,
  // which then stay pinned until its replay, while the planner holds only
  // the sources it named.
  {
    std::vector<std::pair<int, int>> merged;
    for (const auto& [first_member, segment] : order) {
      Group& g = groups[segment];
      if (!merged.empty()) {
        Group& last = groups[merged.back().second];
        if (*g.nodes.begin() <= *last.members.rbegin()) {
          last.members.insert(g.members.begin(), g.members.end());
          last.nodes.insert(g.nodes.begin(), g.nodes.end());
          last.recomputed += g.recomputed;
          continue;
        }
      }
      merged.push_back({first_member, segment});
    }
    order = std::move(merged);
  }
  // A node in a group's range that is no member and writes in place into
  // a value made before the range (ResNet's `out += identity` into bn3's
  // output, when the downsample branch is recomputed with the next block)
  // would make the segment keep a copy of that value for its replay, which
  // the planner does not count. The group runs as two segments instead,
  // split at that node, which runs as an ordinary op between them; each
  // part replays where its own members are first needed, not earlier than
  // the planner's replay of the whole.
  std::vector<std::pair<int, Group>> parts;  // (segment, group)
  for (const auto& [first_member, segment] : order) {
    Group rest = groups[segment];
    while (true) {
      const int first = *rest.nodes.begin();
      const int last = *rest.members.rbegin();
      int cut = -1;
      for (int k = first + 1; k < last && cut < 0; ++k) {
        if (rest.nodes.count(k) != 0) continue;
        for (const Value* w : writes[k]) {
          // (Buffers a module updates in place, BatchNorm's counter, are
          // restored around replays by the segment itself. Lists and dicts
          // are written back and snapshotted for the replay, below: a
          // feature dict filled across the range, torchvision's
          // IntermediateLayerGetter, would otherwise cut every segment
          // around it and pin the tensor crossing the cut until the second
          // part's replay, which the planner does not count: +3.5% at
          // LRASPP's floor on an H100.)
          const int producer = graph.ProducerOf(w);
          if (producer >= 0 && producer < first &&
              w->node()->kind() != c10::prim::GetAttr &&
              !IsMutableContainer(w->type())) {
            cut = k;
          }
        }
      }
      if (cut < 0) break;
      Group before, after;
      for (int m : rest.members) (m < cut ? before : after).members.insert(m);
      for (int k : rest.nodes) (k < cut ? before : after).nodes.insert(k);
      if (after.members.empty()) break;  // (cut < last: cannot happen)
      // A member's lineage before the cut stays in the first part (the
      // second reads its outputs); with no member there, it runs plainly.
      for (int m : before.members) before.recomputed += decisions_of[m];
      after.recomputed = rest.recomputed - before.recomputed;
      if (!before.members.empty()) {
        parts.push_back({segment, std::move(before)});
      }
      rest = std::move(after);
    }
    parts.push_back({segment, std::move(rest)});
  }

  std::vector<SegmentPlan> plans;
  int previous_last = -1;
  for (const auto& [segment, g] : parts) {
    SegmentPlan plan;
    plan.segment = segment;
    plan.members.assign(g.members.begin(), g.members.end());
    plan.recomputed = g.recomputed;
    plan.first_node = std::max(*g.nodes.begin(), previous_last + 1);
    plan.last_node = *g.members.rbegin();

    // Extends the range over in-place writes to member outputs that follow
    // it, as long as the nodes passed hold no activation of their own.
    auto member_roots = [&]() {
      absl::flat_hash_set<const Value*> roots;
      for (int m : plan.members) {
        for (const Value* out : graph.nodes()[m].node->outputs()) {
          roots.insert(AliasRoot(out));
        }
      }
      return roots;
    };
    const auto roots = member_roots();
    for (int k = plan.last_node + 1; k < n; ++k) {
      if (producers.count(k) != 0) break;  // a node holding an activation
      bool writes_member = false;
      for (const Value* w : writes[k]) writes_member |= roots.count(w) > 0;
      if (writes_member) plan.last_node = k;
    }
    previous_last = plan.last_node;
    // Recompute nodes after the range (in-place writes of a member's output
    // past a node holding an activation, and their inputs' lineage) form
    // the tail, if it is self-contained: it writes only member outputs and
    // its own values, and nothing it captures is written after it ran.
    for (int rn : g.nodes) {
      if (rn > plan.last_node) plan.tail.push_back(rn);
    }
    bool tail_ok = true;
    absl::flat_hash_set<const Value*> tail_roots;
    for (int k : plan.tail) {
      for (const Value* w : writes[k]) {
        tail_ok &= roots.count(w) > 0 || tail_roots.count(w) > 0;
      }
      for (const Value* out : graph.nodes()[k].node->outputs()) {
        tail_roots.insert(AliasRoot(out));
      }
      ForEachRead(graph.nodes()[k].node, [&](const Value* v) {
        const int producer = graph.ProducerOf(v);
        if (producer >= plan.first_node && producer <= plan.last_node) return;
        const Value* root = AliasRoot(v);
        if (roots.count(root) > 0 || tail_roots.count(root) > 0) return;
        for (int later = k; later < n; ++later) {
          for (const Value* w : writes[later]) tail_ok &= w != root;
        }
      });
    }
    if (!tail_ok) plan.tail.clear();
    plans.push_back(std::move(plan));
  }
  // A tail node inside another segment's range is not run by the
  // interpreter on its own (it cannot be captured there): no tail.
  for (SegmentPlan& plan : plans) {
    bool inside = false;
    for (const SegmentPlan& other : plans) {
      for (int k : plan.tail) {
        inside |= k > other.first_node && k <= other.last_node;
      }
    }
    if (inside) plan.tail.clear();
  }

  for (SegmentPlan& plan : plans) {
    const std::set<int> member_set(plan.members.begin(), plan.members.end());
    const std::set<int> tail_set(plan.tail.begin(), plan.tail.end());
    // Inputs, attribute reads, outputs.
    absl::flat_hash_set<const Value*> seen;
    for (int id = plan.first_node; id <= plan.last_node; ++id) {
      const Node* node = graph.nodes()[id].node;
      ForEachRead(node, [&](const Value* v) {
        const int producer = graph.ProducerOf(v);
        if (producer >= plan.first_node) return;
        if (seen.insert(v).second) plan.inputs.push_back(v);
      });
      ForEachNested(node, [&](const Node* inner) {
        if (inner->kind() != c10::prim::GetAttr ||
            !HoldsTensors(inner->output()->type())) {
          return;
        }
        std::vector<std::string> path = AttributePath(inner, self);
        if (!path.empty()) plan.attribute_paths.push_back(std::move(path));
      });
      for (const Value* out : node->outputs()) {
        bool used_after = false;
        for (const torch::jit::Use& use : out->uses()) {
          if (use.user == ret) {
            used_after = true;
            continue;
          }
          const Node* owner = use.user;
          while (owner->owningBlock() != graph.graph()->block()) {
            owner = owner->owningBlock()->owningNode();
          }
          for (const IrNode& ir : graph.nodes()) {
            if (ir.node == owner && ir.id > plan.last_node) used_after = true;
          }
        }
        if (used_after) plan.outputs.push_back(out);
      }
    }
    plan.container_output.assign(plan.outputs.size(), false);
    // Lists and dicts from before the range that the range appends to or
    // sets entries of: outputs too, written back into the same object.
    {
      absl::flat_hash_set<const Value*> written_in_range;
      for (int k = plan.first_node; k <= plan.last_node; ++k) {
        for (const Value* w : writes[k]) written_in_range.insert(w);
      }
      for (const Value* in : plan.inputs) {
        if (!IsMutableContainer(in->type()) ||
            written_in_range.count(AliasRoot(in)) == 0) {
          continue;
        }
        bool read_after = false;
        for (int reader : aliasing.ReadersOf(AliasRoot(in))) {
          read_after |= reader > plan.last_node;
        }
        // (The container itself may die inside the range, its entries read
        // later through what was taken out of it: LRASPP's head reads
        // features["low"] and ["high"] in the range that wrote "high".
        // The interpreter drops it there; nothing is left to write back.)
        for (int k = plan.first_node; k <= plan.last_node; ++k) {
          const auto& dead = graph.nodes()[k].dead_after;
          if (std::find(dead.begin(), dead.end(), in) != dead.end()) {
            read_after = false;
          }
        }
        if (!read_after) continue;
        plan.outputs.push_back(in);
        plan.container_output.push_back(true);
      }
    }
    absl::flat_hash_set<const Value*> written;  // in the range or after it
    for (int k = plan.first_node; k < n; ++k) {
      for (const Value* w : writes[k]) written.insert(w);
    }
    for (const Value* in : plan.inputs) {
      // (A list written in place keeps its tensors: Snapshot() copies it.)
      plan.copy_input.push_back(IsTensorType(in->type()) &&
                                written.count(AliasRoot(in)) > 0);
    }
    for (const Value* out : plan.outputs) {
      const Value* root = AliasRoot(out);
      // The storage belongs to the node that made it (an in-place op or a
      // view after a member shares the member's storage). Ops whose schema
      // only says they may alias (aten::contiguous, reshape, to:
      // `Tensor(a)`) made a new storage where the profiler put an activation
      // on them: the first member on the alias chain from the output owns
      // it (ShuffleNet's channel shuffle, view(contiguous(transpose(view(
      // cat)))), held each block's input for the whole step).
      bool made_in_range = false;
      for (const Value* v = out; v != nullptr; v = AliasedInput(v)) {
        if (member_set.count(graph.ProducerOf(v)) > 0) {
          made_in_range = true;
          break;
        }
      }
      bool freeable = made_in_range &&
                      aliasing.returned_roots.count(root) == 0 &&
                      IsTensorType(out->type());
      int last_read = plan.last_node;
      for (int reader : aliasing.ReadersOf(root)) {
        last_read = std::max(last_read, reader);
      }
      // A later write would change what autograd saved: not replayable,
      // unless the replay applies it (a tail node).
      bool written_after = false;
      for (int k = plan.last_node + 1; k < n; ++k) {
        if (tail_set.count(k) != 0) continue;
        for (const Value* w : writes[k]) written_after |= w == root;
      }
      freeable &= !written_after;
      plan.written_after.push_back(written_after);
      plan.freeable.push_back(freeable);
      plan.free_after.push_back(last_read);
    }
  }

  // Readers of a freeable output trigger the replay. Storages read by a
  // later segment (its inputs) are pinned at run time until that segment
  // replayed (as the planner holds a segment's sources until its replay),
  // then freed; its range's nodes are readers too (its function's node).
  for (SegmentPlan& plan : plans) {
    plan.output_readers.assign(plan.outputs.size(), {});
    for (size_t i = 0; i < plan.outputs.size(); ++i) {
      if (!plan.freeable[i]) continue;
      for (int reader : aliasing.ReadersOf(AliasRoot(plan.outputs[i]))) {
        if (reader > plan.last_node) plan.output_readers[i].push_back(reader);
      }
    }
  }
  return plans;
}

// The schedule's SWAP decisions, in decision order. InvalidArgument names a
// decision whose producer or offload point is not a forward position.
absl::StatusOr<std::vector<SwapPlan>> PlanSwaps(const Graph& graph,
                                                const GraphAliasing& aliasing,
                                                const v1::Schedule& schedule) {
  std::vector<SwapPlan> swaps;
  const int n = graph.num_nodes();
  for (int i = 0; i < schedule.decisions_size(); ++i) {
    const v1::Decision& d = schedule.decisions(i);
    if (d.action() != v1::Decision::SWAP) continue;
    if (d.producer_node() < 0 || d.producer_node() >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("decisions[", i, "] (value_id ", d.value_id(),
                       "): producer_node ", d.producer_node(),
                       " is not a node of the model's graph (", n, " nodes)"));
    }
    if (d.offload_after() < d.producer_node() || d.offload_after() >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decisions[", i, "] (value_id ", d.value_id(), "): offload_after ",
          d.offload_after(), " must be a forward position in [",
          d.producer_node(), ", ", n, ")"));
    }
    SwapPlan plan;
    plan.value_id = d.value_id();
    plan.producer = d.producer_node();
    plan.offload_after = d.offload_after();
    plan.planned_offload_after = d.offload_after();
    // The prefetch point is a backward step of a node that ran before the
    // producer's readers (later in backward means too late to overlap).
    if (d.prefetch_at() >= n && d.prefetch_node() >= 0 &&
        d.prefetch_node() < n) {
      plan.prefetch_node = d.prefetch_node();
    }
    bool is_returned = false;
    std::set<int> readers;
    absl::flat_hash_set<const Value*> roots;
    for (const Value* out : graph.nodes()[plan.producer].node->outputs()) {
      const Value* root = AliasRoot(out);
      is_returned |= aliasing.returned_roots.count(root) > 0;
      for (int r : aliasing.ReadersOf(root)) {
        if (r > plan.producer) readers.insert(r);
      }
      roots.insert(root);
      plan.values.push_back(out);
    }
    // Returned outputs feed the loss: they cannot leave during forward.
    if (is_returned) continue;
    plan.readers.assign(readers.begin(), readers.end());
    if (!plan.readers.empty()) {
      plan.offload_after = std::max(plan.offload_after, plan.readers.back());
    }
    for (int id = plan.producer + 1; id <= plan.offload_after; ++id) {
      for (const Value* out : graph.nodes()[id].node->outputs()) {
        if (roots.count(AliasRoot(out)) > 0) plan.values.push_back(out);
      }
    }
    swaps.push_back(std::move(plan));
  }
  return swaps;
}

}  // namespace

absl::StatusOr<ExecutionPlan> CompileSchedule(const Graph& graph,
                                              const v1::Schedule& schedule) {
  const GraphAliasing aliasing = AnalyzeAliasing(graph);
  ExecutionPlan plan;
  // Segments first: their errors (a decision of any action naming a node
  // the graph does not have) come before the swaps' own.
  MUTWO_ASSIGN_OR_RETURN(plan.segments,
                         PlanSegments(graph, aliasing, schedule));
  MUTWO_ASSIGN_OR_RETURN(plan.swaps, PlanSwaps(graph, aliasing, schedule));
  return plan;
}

}  // namespace mutwo::worker
