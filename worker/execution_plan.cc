#include "worker/execution_plan.h"

#include <algorithm>
#include <map>
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
#include "worker/graph_aliasing.h"

namespace mutwo::worker {
namespace {

using torch::jit::Node;
using torch::jit::Value;

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

// A segment being planned: the producers of its RECOMPUTE decisions
// (members), the nodes they are rebuilt from (members included) and how
// many decisions it holds.
struct SegmentGroup {
  std::set<int> members, nodes;
  int recomputed = 0;
};

// Groups in the order they run: (Decision.segment, group).
using SegmentGroups = std::vector<std::pair<int, SegmentGroup>>;

// The schedule's decisions as segment planning reads them.
struct GroupedDecisions {
  SegmentGroups groups;     // by Decision.segment, ordered by first member
  std::set<int> producers;  // nodes holding an activation (any action)
  std::map<int, int> decisions_of;  // node -> its RECOMPUTE decisions
};

// Groups the schedule's RECOMPUTE decisions by Decision.segment, ordered by
// their first member. InvalidArgument names a decision whose producer or
// recompute node is not a node of `graph` (of any action: its producer is
// said to hold an activation).
absl::StatusOr<GroupedDecisions> GroupDecisions(const Graph& graph,
                                                const v1::Schedule& schedule) {
  const int n = graph.num_nodes();
  GroupedDecisions grouped;
  std::map<int, SegmentGroup> groups;
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
    grouped.producers.insert(d.producer_node());
    if (d.action() != v1::Decision::RECOMPUTE) continue;
    SegmentGroup& g = groups[d.segment()];
    ++grouped.decisions_of[d.producer_node()];
    g.members.insert(d.producer_node());
    g.nodes.insert(d.producer_node());
    ++g.recomputed;
    for (int rn : d.recompute_nodes()) {
      if (rn < 0 || rn >= n) return bad_node(rn);
      g.nodes.insert(rn);
    }
  }
  std::vector<std::pair<int, int>> order;  // (first member, segment)
  order.reserve(groups.size());
  for (const auto& [segment, g] : groups) {
    order.push_back({*g.members.begin(), segment});
  }
  std::sort(order.begin(), order.end());
  for (const auto& [first_member, segment] : order) {
    grouped.groups.push_back({segment, std::move(groups[segment])});
  }
  return grouped;
}

// Groups whose replays overlap (a later group rebuilds its activations
// from nodes inside an earlier group's range: GPT's attention output from
// the q/k/v a previous group replays) run as one segment, under the
// earlier one's number. Clipping the later range instead would make it
// read the earlier group's outputs, which then stay pinned until its
// replay, while the planner holds only the sources it named.
SegmentGroups MergeOverlappingGroups(const SegmentGroups& groups) {
  SegmentGroups merged;
  for (const auto& [segment, g] : groups) {
    if (!merged.empty()) {
      SegmentGroup& last = merged.back().second;
      if (*g.nodes.begin() <= *last.members.rbegin()) {
        last.members.insert(g.members.begin(), g.members.end());
        last.nodes.insert(g.nodes.begin(), g.nodes.end());
        last.recomputed += g.recomputed;
        continue;
      }
    }
    merged.push_back({segment, g});
  }
  return merged;
}

// Per node: the roots it writes in place.
using NodeWrites = std::vector<std::vector<const Value*>>;

NodeWrites WritesByNode(const Graph& graph) {
  NodeWrites writes(graph.num_nodes());
  for (const IrNode& ir : graph.nodes()) {
    ForEachWritten(ir.node, [&](const Value* v) {
      writes[ir.id].push_back(AliasRoot(v));
    });
  }
  return writes;
}

// The first node in `group`'s range that is no member of it and writes in
// place into a value made before the range, or -1.
int OuterWriteInRange(const Graph& graph, const NodeWrites& writes,
                      const SegmentGroup& group) {
  const int first = *group.nodes.begin();
  const int last = *group.members.rbegin();
  for (int k = first + 1; k < last; ++k) {
    if (group.nodes.count(k) != 0) continue;
    for (const Value* w : writes[k]) {
      // (Buffers a module updates in place, BatchNorm's counter, are
      // restored around replays by the segment itself. Lists and dicts are
      // written back and snapshotted for the replay (AddContainerOutputs):
      // a feature dict filled across the range, torchvision's
      // IntermediateLayerGetter, would otherwise cut every segment around
      // it and pin the tensor crossing the cut until the second part's
      // replay, which the planner does not count: +3.5% at LRASPP's floor
      // on an H100.)
      const int producer = graph.ProducerOf(w);
      if (producer >= 0 && producer < first &&
          w->node()->kind() != c10::prim::GetAttr &&
          !IsMutableContainer(w->type())) {
        return k;
      }
    }
  }
  return -1;
}

// A node in a group's range that is no member and writes in place into a
// value made before the range (ResNet's `out += identity` into bn3's
// output, when the downsample branch is recomputed with the next block)
// would make the segment keep a copy of that value for its replay, which
// the planner does not count. The group runs as two segments instead,
// split at that node, which runs as an ordinary op between them; each part
// replays where its own members are first needed, not earlier than the
// planner's replay of the whole.
SegmentGroups SplitAtOuterWrites(const Graph& graph, const NodeWrites& writes,
                                 const std::map<int, int>& decisions_of,
                                 const SegmentGroups& groups) {
  SegmentGroups parts;
  for (const auto& [segment, group] : groups) {
    SegmentGroup rest = group;
    while (true) {
      const int cut = OuterWriteInRange(graph, writes, rest);
      if (cut < 0) break;
      SegmentGroup before, after;
      for (int m : rest.members) (m < cut ? before : after).members.insert(m);
      for (int k : rest.nodes) (k < cut ? before : after).nodes.insert(k);
      if (after.members.empty()) break;  // (cut < last: cannot happen)
      // A member's lineage before the cut stays in the first part (the
      // second reads its outputs); with no member there, it runs plainly.
      for (int m : before.members) before.recomputed += decisions_of.at(m);
      after.recomputed = rest.recomputed - before.recomputed;
      if (!before.members.empty()) {
        parts.push_back({segment, std::move(before)});
      }
      rest = std::move(after);
    }
    parts.push_back({segment, std::move(rest)});
  }
  return parts;
}

// The roots of the members' outputs.
absl::flat_hash_set<const Value*> MemberRoots(const Graph& graph,
                                              const std::vector<int>& members) {
  absl::flat_hash_set<const Value*> roots;
  for (int m : members) {
    for (const Value* out : graph.nodes()[m].node->outputs()) {
      roots.insert(AliasRoot(out));
    }
  }
  return roots;
}

// Whether `plan.tail` is self-contained: it writes only member outputs
// (`member_roots`) and its own values, and nothing it captures from outside
// the range is written after it ran.
bool TailIsSelfContained(
    const Graph& graph, const NodeWrites& writes, const SegmentPlan& plan,
    const absl::flat_hash_set<const Value*>& member_roots) {
  const int n = graph.num_nodes();
  bool tail_ok = true;
  absl::flat_hash_set<const Value*> tail_roots;
  for (int k : plan.tail) {
    for (const Value* w : writes[k]) {
      tail_ok &= member_roots.count(w) > 0 || tail_roots.count(w) > 0;
    }
    for (const Value* out : graph.nodes()[k].node->outputs()) {
      tail_roots.insert(AliasRoot(out));
    }
    ForEachRead(graph.nodes()[k].node, [&](const Value* v) {
      const int producer = graph.ProducerOf(v);
      if (producer >= plan.first_node && producer <= plan.last_node) return;
      const Value* root = AliasRoot(v);
      if (member_roots.count(root) > 0 || tail_roots.count(root) > 0) return;
      for (int later = k; later < n; ++later) {
        for (const Value* w : writes[later]) tail_ok &= w != root;
      }
    });
  }
  return tail_ok;
}

// Each part's node range and tail. Ranges start at the part's earliest
// node, clipped after the previous range so that they never overlap, and
// end at its last member, extended over in-place writes to member outputs
// that follow it as long as the nodes passed hold no activation of their
// own (`producers`). Recompute nodes after the range (in-place writes of a
// member's output past a node holding an activation, and their inputs'
// lineage) form the tail, if it is self-contained.
std::vector<SegmentPlan> PlaceRanges(const Graph& graph,
                                     const NodeWrites& writes,
                                     const std::set<int>& producers,
                                     const SegmentGroups& parts) {
  const int n = graph.num_nodes();
  std::vector<SegmentPlan> plans;
  int previous_last = -1;
  for (const auto& [segment, g] : parts) {
    SegmentPlan plan;
    plan.segment = segment;
    plan.members.assign(g.members.begin(), g.members.end());
    plan.recomputed = g.recomputed;
    plan.first_node = std::max(*g.nodes.begin(), previous_last + 1);
    plan.last_node = *g.members.rbegin();
    const absl::flat_hash_set<const Value*> roots =
        MemberRoots(graph, plan.members);
    for (int k = plan.last_node + 1; k < n; ++k) {
      if (producers.count(k) != 0) break;  // a node holding an activation
      bool writes_member = false;
      for (const Value* w : writes[k]) writes_member |= roots.count(w) > 0;
      if (writes_member) plan.last_node = k;
    }
    previous_last = plan.last_node;
    for (int rn : g.nodes) {
      if (rn > plan.last_node) plan.tail.push_back(rn);
    }
    if (!TailIsSelfContained(graph, writes, plan, roots)) plan.tail.clear();
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
  return plans;
}

// Whether a top-level node after `last_node`, or forward's return, uses
// `out` (inside its blocks included).
bool UsedAfter(const Graph& graph, const Value* out, int last_node) {
  const Node* ret = graph.graph()->return_node();
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
      if (ir.node == owner && ir.id > last_node) used_after = true;
    }
  }
  return used_after;
}

// The range's inputs (values read in it and defined before it), the
// attribute paths of the tensors it reads from `self`, and its outputs
// (values defined in it and used after it).
void FindBoundary(const Graph& graph, SegmentPlan& plan) {
  const Value* self = graph.graph()->inputs()[0];
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
      if (UsedAfter(graph, out, plan.last_node)) plan.outputs.push_back(out);
    }
  }
  plan.container_output.assign(plan.outputs.size(), false);
}

// Lists and dicts from before the range that the range appends to or sets
// entries of, and that are read after it: outputs too, written back into
// the same object.
void AddContainerOutputs(const Graph& graph, const GraphAliasing& aliasing,
                         const NodeWrites& writes, SegmentPlan& plan) {
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
    // features["low"] and ["high"] in the range that wrote "high". The
    // interpreter drops it there; nothing is left to write back.)
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

// Which inputs are kept as copies (tensors written in place in the range or
// after it; a list written in place keeps its tensors: Snapshot() copies
// it), and per output whether it is written after the range, whether its
// storage may be freed, and after which node.
void MarkCopiesAndFrees(const Graph& graph, const GraphAliasing& aliasing,
                        const NodeWrites& writes, SegmentPlan& plan) {
  const int n = graph.num_nodes();
  const std::set<int> member_set(plan.members.begin(), plan.members.end());
  const std::set<int> tail_set(plan.tail.begin(), plan.tail.end());
  absl::flat_hash_set<const Value*> written;  // in the range or after it
  for (int k = plan.first_node; k < n; ++k) {
    for (const Value* w : writes[k]) written.insert(w);
  }
  for (const Value* in : plan.inputs) {
    plan.copy_input.push_back(IsTensorType(in->type()) &&
                              written.count(AliasRoot(in)) > 0);
  }
  for (const Value* out : plan.outputs) {
    const Value* root = AliasRoot(out);
    // The storage belongs to the node that made it (an in-place op or a
    // view after a member shares the member's storage). Ops whose schema
    // only says they may alias (aten::contiguous, reshape, to:
    // `Tensor(a)`) made a new storage where the profiler put an activation
    // on them: the first member on the alias chain from the output owns it
    // (ShuffleNet's channel shuffle, view(contiguous(transpose(view(cat)))),
    // held each block's input for the whole step).
    bool made_in_range = false;
    for (const Value* v = out; v != nullptr; v = AliasedInput(v)) {
      if (member_set.count(graph.ProducerOf(v)) > 0) {
        made_in_range = true;
        break;
      }
    }
    bool freeable = made_in_range && aliasing.returned_roots.count(root) == 0 &&
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
void FindOutputReaders(const GraphAliasing& aliasing, SegmentPlan& plan) {
  plan.output_readers.assign(plan.outputs.size(), {});
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    if (!plan.freeable[i]) continue;
    for (int reader : aliasing.ReadersOf(AliasRoot(plan.outputs[i]))) {
      if (reader > plan.last_node) plan.output_readers[i].push_back(reader);
    }
  }
}

// The schedule's RECOMPUTE decisions as segments, in node order (ranges
// disjoint). InvalidArgument names a decision whose producer or recompute
// node is not a node of `graph`.
absl::StatusOr<std::vector<SegmentPlan>> PlanSegments(
    const Graph& graph, const GraphAliasing& aliasing,
    const v1::Schedule& schedule) {
  MUTWO_ASSIGN_OR_RETURN(GroupedDecisions grouped,
                         GroupDecisions(graph, schedule));
  const NodeWrites writes = WritesByNode(graph);
  const SegmentGroups parts =
      SplitAtOuterWrites(graph, writes, grouped.decisions_of,
                         MergeOverlappingGroups(grouped.groups));
  std::vector<SegmentPlan> plans =
      PlaceRanges(graph, writes, grouped.producers, parts);
  for (SegmentPlan& plan : plans) {
    FindBoundary(graph, plan);
    AddContainerOutputs(graph, aliasing, writes, plan);
    MarkCopiesAndFrees(graph, aliasing, writes, plan);
    FindOutputReaders(aliasing, plan);
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
