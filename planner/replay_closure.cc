#include "planner/replay_closure.h"

#include <algorithm>
#include <vector>

namespace mutwo::planner {

Decisions CloseOverReplays(const PlanProfile& profile,
                           const Decisions& decisions, const SimResult& sim) {
  const int a_count = static_cast<int>(profile.activations.size());
  const int n = static_cast<int>(profile.nodes.size());
  // Per segment: the range of nodes the executor runs, from the first node
  // it replays to its last member's producer.
  std::vector<int> range_begin(sim.segments, n), range_end(sim.segments, -1);
  for (int a = 0; a < a_count; ++a) {
    const int s = sim.segment_of[a];
    if (s < 0 || decisions[a].action != Action::kRecompute) continue;
    const PlanActivation& act = profile.activations[a];
    range_end[s] = std::max(range_end[s], act.producer_node);
    range_begin[s] = std::min(range_begin[s], act.producer_node);
    for (int node : act.recompute_nodes) {
      range_begin[s] = std::min(range_begin[s], node);
    }
  }
  // Per node: the segment whose range holds it (-1: none; the executor
  // merges overlapping ranges, the first one is enough here).
  std::vector<int> replayed_by(n, -1);
  for (int s = 0; s < sim.segments; ++s) {
    for (int node = range_begin[s]; node <= range_end[s]; ++node) {
      if (replayed_by[node] < 0) replayed_by[node] = s;
    }
  }
  // Per segment: what it holds for its replay (its members' sources).
  std::vector<std::vector<int>> held(sim.segments);
  for (int a = 0; a < a_count; ++a) {
    const int s = sim.segment_of[a];
    if (s < 0 || decisions[a].action != Action::kRecompute) continue;
    for (int src : profile.activations[a].recompute_sources) {
      held[s].push_back(src);
    }
  }
  Decisions out = decisions;
  bool changed = false;
  for (int a = 0; a < a_count; ++a) {
    if (decisions[a].action != Action::kRetain) continue;
    const PlanActivation& act = profile.activations[a];
    const int s = replayed_by[act.producer_node];
    if (s < 0 || !profile.nodes[act.producer_node].is_op ||
        act.last_forward_use > range_end[s]) {
      continue;
    }
    // Rebuilt by the same replay from what the segment holds anyway: its
    // sources are made in the range or held for it. (Also an activation the
    // profiler would not let the policy recompute, a softmax behind Swin's
    // attention-mask `if`: the range runs it again all the same.)
    const bool rebuilt = std::all_of(
        act.recompute_sources.begin(), act.recompute_sources.end(),
        [&](int src) {
          return replayed_by[profile.activations[src].producer_node] == s ||
                 std::find(held[s].begin(), held[s].end(), src) !=
                     held[s].end();
        });
    if (!rebuilt) continue;
    out[a].action = Action::kRecompute;
    out[a].prefetch_at = -1;
    changed = true;
  }
  return changed ? out : decisions;
}

}  // namespace mutwo::planner
