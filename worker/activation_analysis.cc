#include "worker/activation_analysis.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"

namespace mutwo::worker {

ActivationAnalysis AnalyzeActivations(const std::vector<LineageNode>& nodes,
                                      const StepMemoryRecord& step) {
  ActivationAnalysis analysis;
  const int n = static_cast<int>(nodes.size());
  const int num_steps = static_cast<int>(step.step_forward_node.size());

  // Activations: live allocations at the end of forward, by producer node.
  std::map<int, std::vector<LiveBlock>> by_node;
  for (const LiveBlock& block : step.live_at_end_of_forward) {
    if (block.tag >= 0 && block.tag < n) {
      by_node[static_cast<int>(block.tag)].push_back(block);
    } else if (block.tag == kLossTag) {
      analysis.loss_bytes += block.size_bytes;
    }
  }
  // Position after which each block was freed (first free after the
  // snapshot; frees after backward count as the last step).
  const int last_position = n + std::max(num_steps, 1) - 1;
  absl::flat_hash_map<uintptr_t, int> freed_at;
  for (const FreeEvent& event : step.frees) {
    const int position = event.tag >= n && event.tag <= last_position
                             ? static_cast<int>(event.tag)
                             : last_position;
    freed_at.emplace(event.address, position);
  }
  // Which nodes expose a storage (outputs sharing it: in-place ops, views).
  absl::flat_hash_map<uintptr_t, std::vector<int>> exposed_by;
  for (int id = 0; id < n; ++id) {
    for (uintptr_t address : step.output_storages[id]) {
      auto& list = exposed_by[address];
      if (list.empty() || list.back() != id) list.push_back(id);
    }
  }
  // First backward position of the steps mapped to each node.
  std::vector<int> first_step_of(n, std::numeric_limits<int>::max());
  for (int k = 0; k < num_steps; ++k) {
    const int node = step.step_forward_node[k];
    if (node >= 0) first_step_of[node] = std::min(first_step_of[node], n + k);
  }

  // Liveness.
  absl::flat_hash_map<uintptr_t, int> value_of_address;
  for (const auto& [producer, blocks] : by_node) {
    ActivationRecord a;
    a.value_id = static_cast<int>(analysis.activations.size());
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
      auto freed = freed_at.find(block.address);
      last_backward =
          std::max(last_backward,
                   freed == freed_at.end() ? last_position : freed->second);
      auto exposers = exposed_by.find(block.address);
      if (exposers != exposed_by.end()) {
        users.insert(exposers->second.begin(), exposers->second.end());
      }
    }
    for (int user : std::set<int>(users)) {
      last_forward = std::max(last_forward, nodes[user].last_use);
      for (int consumer : nodes[user].consumers) users.insert(consumer);
    }
    for (int user : users) {
      first_backward = std::min(first_backward, first_step_of[user]);
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
    analysis.tracked_bytes += a.size_bytes;
    analysis.activations.push_back(std::move(a));
  }

  // Recompute lineage: walk back from the producer through nodes whose
  // outputs were not kept; stop at kept outputs (sources when they are
  // activations), parameters, inputs and non-tensor values. In-place ops
  // after the producer that write its storage (ResNet's `out += identity;
  // relu_(out)` after the block's last batch norm) are replayed too:
  // autograd saved the value after them, so the replay must apply them, and
  // what they read (the identity) is a source held until the replay.
  for (ActivationRecord& a : analysis.activations) {
    const int producer = a.producer_node;
    std::set<int> replay{producer};
    std::set<int> sources;
    std::vector<int> stack(nodes[producer].input_nodes);
    for (const LiveBlock& block : by_node[producer]) {
      auto exposers = exposed_by.find(block.address);
      if (exposers == exposed_by.end()) continue;
      for (int writer : exposers->second) {
        if (writer <= producer || !nodes[writer].writes_in_place) continue;
        replay.insert(writer);
        const auto& inputs = nodes[writer].input_nodes;
        stack.insert(stack.end(), inputs.begin(), inputs.end());
      }
    }
    // A kept storage written in place by a replayed node, or between its
    // producer and the last replayed node (EfficientNet's `silu_(bn(x))`:
    // the storage holds the value after silu_, not the one silu_ read and
    // autograd saved a copy of), does not hold the value the replay reads:
    // its producer is replayed too.
    const int last_replayed = *replay.rbegin();
    auto overwritten = [&](int id) {
      for (uintptr_t address : step.output_storages[id]) {
        auto exposers = exposed_by.find(address);
        if (exposers == exposed_by.end()) continue;
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
  return analysis;
}

}  // namespace mutwo::worker
