#include "worker/activation_analysis.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace mutwo::worker {
namespace {

// The step's records indexed for the analysis, computed once.
struct StepIndex {
  // Activations: live allocations at the end of forward, by producer node.
  std::map<int, std::vector<LiveBlock>> by_node;
  // Live bytes the loss made.
  int64_t loss_bytes = 0;
  // The last position (frees after backward count as the last step).
  int last_position = 0;
  // Position after which each block was freed (first free after the
  // snapshot).
  absl::flat_hash_map<uintptr_t, int> freed_at;
  // Which nodes expose a storage (outputs sharing it: in-place ops, views).
  absl::flat_hash_map<uintptr_t, std::vector<int>> exposed_by;
  // First backward position of the steps mapped to each node.
  std::vector<int> first_step_of;
};

StepIndex IndexStep(int n, const StepMemoryRecord& step) {
  StepIndex index;
  const int num_steps = static_cast<int>(step.step_forward_node.size());
  for (const LiveBlock& block : step.live_at_end_of_forward) {
    if (block.tag >= 0 && block.tag < n) {
      index.by_node[static_cast<int>(block.tag)].push_back(block);
    } else if (block.tag == kLossTag) {
      index.loss_bytes += block.size_bytes;
    }
  }
  index.last_position = n + std::max(num_steps, 1) - 1;
  for (const FreeEvent& event : step.frees) {
    const int position = event.tag >= n && event.tag <= index.last_position
                             ? static_cast<int>(event.tag)
                             : index.last_position;
    index.freed_at.emplace(event.address, position);
  }
  for (int id = 0; id < n; ++id) {
    for (uintptr_t address : step.output_storages[id]) {
      auto& list = index.exposed_by[address];
      if (list.empty() || list.back() != id) list.push_back(id);
    }
  }
  index.first_step_of.assign(n, std::numeric_limits<int>::max());
  for (int k = 0; k < num_steps; ++k) {
    const int node = step.step_forward_node[k];
    if (node >= 0) {
      index.first_step_of[node] = std::min(index.first_step_of[node], n + k);
    }
  }
  return index;
}

// The activation `producer` made of `blocks`: its size, the outputs it
// holds, and when it is last read in forward, first needed and freed in
// backward. Records which value each block belongs to in
// `value_of_address`.
ActivationRecord Liveness(
    const std::vector<LineageNode>& nodes, const StepMemoryRecord& step,
    const StepIndex& index, int producer, const std::vector<LiveBlock>& blocks,
    int value_id, absl::flat_hash_map<uintptr_t, int>& value_of_address) {
  const int n = static_cast<int>(nodes.size());
  ActivationRecord a;
  a.value_id = value_id;
  a.producer_node = producer;
  const std::vector<uintptr_t>& outputs = step.output_storages[producer];
  int last_forward = nodes[producer].last_use;
  int first_backward = std::numeric_limits<int>::max();
  int last_backward = n;
  std::set<int> users{producer};
  for (const LiveBlock& block : blocks) {
    a.size_bytes += block.size_bytes;
    // A swap moves the producer's output storages only.
    const auto output =
        std::find(outputs.begin(), outputs.end(), block.address);
    if (output == outputs.end()) {
      a.unswappable_bytes += block.size_bytes;
    } else if (producer < static_cast<int>(step.output_indices.size())) {
      const auto& indices = step.output_indices[producer];
      const size_t k = static_cast<size_t>(output - outputs.begin());
      if (k < indices.size()) a.output_indices.push_back(indices[k]);
    }
    value_of_address[block.address] = a.value_id;
    auto freed = index.freed_at.find(block.address);
    last_backward = std::max(last_backward, freed == index.freed_at.end()
                                                ? index.last_position
                                                : freed->second);
    auto exposers = index.exposed_by.find(block.address);
    if (exposers != index.exposed_by.end()) {
      users.insert(exposers->second.begin(), exposers->second.end());
    }
  }
  for (int user : std::set<int>(users)) {
    last_forward = std::max(last_forward, nodes[user].last_use);
    for (int consumer : nodes[user].consumers) users.insert(consumer);
  }
  for (int user : users) {
    first_backward = std::min(first_backward, index.first_step_of[user]);
  }
  if (first_backward > last_backward) first_backward = last_backward;
  a.storages = static_cast<int>(blocks.size());
  std::sort(a.output_indices.begin(), a.output_indices.end());
  a.output_indices.erase(
      std::unique(a.output_indices.begin(), a.output_indices.end()),
      a.output_indices.end());
  a.last_forward_use = last_forward;
  a.first_backward_use = first_backward;
  a.last_backward_use = last_backward;
  return a;
}

// Recompute lineage: walk back from the producer through nodes whose
// outputs were not kept; stop at kept outputs (sources when they are
// activations), parameters, inputs and non-tensor values. In-place ops
// after the producer that write its storage (ResNet's `out += identity;
// relu_(out)` after the block's last batch norm) are replayed too:
// autograd saved the value after them, so the replay must apply them, and
// what they read (the identity) is a source held until the replay.
void FindLineage(const std::vector<LineageNode>& nodes,
                 const StepMemoryRecord& step, const StepIndex& index,
                 const absl::flat_hash_map<uintptr_t, int>& value_of_address,
                 ActivationRecord& a) {
  const int producer = a.producer_node;
  std::set<int> replay{producer};
  std::set<int> sources;
  std::vector<int> stack(nodes[producer].input_nodes);
  for (const LiveBlock& block : index.by_node.at(producer)) {
    auto exposers = index.exposed_by.find(block.address);
    if (exposers == index.exposed_by.end()) continue;
    for (int writer : exposers->second) {
      if (writer <= producer || !nodes[writer].writes_in_place) continue;
      replay.insert(writer);
      const auto& inputs = nodes[writer].input_nodes;
      stack.insert(stack.end(), inputs.begin(), inputs.end());
    }
  }
  // A kept storage written in place by a replayed node, or between its
  // producer and the last replayed node (EfficientNet's `silu_(bn(x))`: the
  // storage holds the value after silu_, not the one silu_ read and
  // autograd saved a copy of), does not hold the value the replay reads:
  // its producer is replayed too.
  const int last_replayed = *replay.rbegin();
  auto overwritten = [&](int id) {
    for (uintptr_t address : step.output_storages[id]) {
      auto exposers = index.exposed_by.find(address);
      if (exposers == index.exposed_by.end()) continue;
      for (int writer : exposers->second) {
        if (writer > id && writer <= last_replayed &&
            nodes[writer].writes_in_place) {
          return true;
        }
      }
    }
    return false;
  };
  std::set<int> seen(replay);
  {
    std::vector<int> first;
    for (int id : stack) {
      if (seen.insert(id).second) first.push_back(id);
    }
    stack = std::move(first);
  }
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    const auto& storages = step.output_storages[id];
    if (storages.empty()) continue;  // non-tensor value: kept as is
    if (step.outputs_alive[id] && !overwritten(id)) {
      for (uintptr_t address : storages) {
        auto it = value_of_address.find(address);
        if (it != value_of_address.end() && it->second != a.value_id) {
          sources.insert(it->second);
        }
      }
      continue;
    }
    replay.insert(id);
    for (int input : nodes[id].input_nodes) {
      if (seen.insert(input).second) stack.push_back(input);
    }
  }
  a.recompute_nodes.assign(replay.begin(), replay.end());
  a.recompute_sources.assign(sources.begin(), sources.end());
  for (int id : replay) {
    if (nodes[id].reads_mutated_container) {
      a.mutated_container_reader = id;
      break;
    }
  }
}

}  // namespace

ActivationAnalysis AnalyzeActivations(const std::vector<LineageNode>& nodes,
                                      const StepMemoryRecord& step) {
  const StepIndex index = IndexStep(static_cast<int>(nodes.size()), step);
  ActivationAnalysis analysis;
  analysis.loss_bytes = index.loss_bytes;
  // Every activation's liveness first: the lineage walk stops at the
  // storages of any of them (value_of_address).
  absl::flat_hash_map<uintptr_t, int> value_of_address;
  for (const auto& [producer, blocks] : index.by_node) {
    ActivationRecord a = Liveness(nodes, step, index, producer, blocks,
                                  static_cast<int>(analysis.activations.size()),
                                  value_of_address);
    analysis.tracked_bytes += a.size_bytes;
    analysis.activations.push_back(std::move(a));
  }
  for (ActivationRecord& a : analysis.activations) {
    FindLineage(nodes, step, index, value_of_address, a);
  }
  return analysis;
}

}  // namespace mutwo::worker
