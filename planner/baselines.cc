#include "planner/baselines.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace mutwo::planner {
namespace {

// Op nodes that produced at least one activation, in node order, with the
// activations of each.
std::vector<std::vector<int>> ProducerGroups(const PlanProfile& profile,
                                             std::vector<int>* nodes) {
  std::vector<std::vector<int>> by_node(profile.nodes.size());
  for (size_t a = 0; a < profile.activations.size(); ++a) {
    by_node[profile.activations[a].producer_node].push_back(
        static_cast<int>(a));
  }
  std::vector<std::vector<int>> groups;
  for (size_t n = 0; n < by_node.size(); ++n) {
    if (by_node[n].empty() || !profile.nodes[n].is_op) continue;
    bool recomputable = true;
    for (int a : by_node[n])
      recomputable &= profile.activations[a].recomputable;
    if (!recomputable) continue;
    groups.push_back(by_node[n]);
    nodes->push_back(static_cast<int>(n));
  }
  return groups;
}

}  // namespace

std::string TopLevelBlock(const std::string& scope) {
  std::vector<std::string> parts = absl::StrSplit(scope, '.');
  if (parts.empty() || parts[0].empty()) return "";
  if (parts.size() >= 2 && !parts[1].empty() &&
      std::all_of(parts[1].begin(), parts[1].end(),
                  [](char c) { return absl::ascii_isdigit(c); })) {
    return parts[0] + "." + parts[1];
  }
  return parts[0];
}

Decisions NoCheckpointing(const PlanProfile& profile) {
  return Decisions(profile.activations.size());
}

Decisions SqrtNCheckpointing(const PlanProfile& profile) {
  Decisions d(profile.activations.size());
  std::vector<int> nodes;
  const auto groups = ProducerGroups(profile, &nodes);
  if (groups.empty()) return d;
  const size_t length = static_cast<size_t>(
      std::ceil(std::sqrt(static_cast<double>(groups.size()))));
  for (size_t i = 0; i < groups.size(); ++i) {
    const bool segment_end = (i + 1) % length == 0 || i + 1 == groups.size();
    if (segment_end) continue;
    for (int a : groups[i]) d[a].action = Action::kRecompute;
  }
  return d;
}

Decisions PerBlockCheckpointing(const PlanProfile& profile) {
  Decisions d(profile.activations.size());
  std::vector<int> nodes;
  const auto groups = ProducerGroups(profile, &nodes);
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string block = TopLevelBlock(profile.nodes[nodes[i]].scope);
    if (block.empty()) continue;
    const bool block_end =
        i + 1 == groups.size() ||
        TopLevelBlock(profile.nodes[nodes[i + 1]].scope) != block;
    if (block_end) continue;
    for (int a : groups[i]) d[a].action = Action::kRecompute;
  }
  return d;
}

}  // namespace mutwo::planner
