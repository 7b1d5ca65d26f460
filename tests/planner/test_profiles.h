// Hand-built and random profiles for the planner tests.
#ifndef MUTWO_TESTS_PLANNER_TEST_PROFILES_H_
#define MUTWO_TESTS_PLANNER_TEST_PROFILES_H_

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "planner/model.h"

namespace mutwo::planner::testing {

struct ActivationSpec {
  int producer;
  int64_t size;
  int lfu, fbu, lbu;
  std::vector<int> sources;
};

// A profile without allocator figures (the simulator derives the curve from
// `fixed` and the lifetimes), one op node per forward position, every node
// 1 ms forward, every backward step 1 ms.
inline PlanProfile MakeProfile(int forward_nodes, int backward_steps,
                               int64_t fixed,
                               const std::vector<ActivationSpec>& specs) {
  PlanProfile p;
  p.nodes.resize(forward_nodes);
  for (auto& n : p.nodes) n.forward_ms = 1;
  p.backward_steps.resize(backward_steps);
  for (auto& s : p.backward_steps) s.ms = 1;
  p.fixed_bytes = fixed;
  for (size_t i = 0; i < specs.size(); ++i) {
    PlanActivation a;
    a.value_id = static_cast<int>(i);
    a.producer_node = specs[i].producer;
    a.size_bytes = specs[i].size;
    a.last_forward_use = specs[i].lfu;
    a.first_backward_use = specs[i].fbu;
    a.last_backward_use = specs[i].lbu;
    a.recompute_sources = specs[i].sources;
    a.recompute_nodes = {specs[i].producer};
    a.recompute_ms = 1;
    p.activations.push_back(a);
  }
  return p;
}

// A -> B -> C, 3 backward steps; sizes 100, 200, 300; fixed 1000.
inline PlanProfile Chain() {
  return MakeProfile(
      3, 3, 1000,
      {{0, 100, 1, 5, 5, {}}, {1, 200, 2, 4, 4, {0}}, {2, 300, 2, 3, 3, {1}}});
}

// A -> {B, C} -> D -> E; 5 forward nodes, 5 backward steps.
inline PlanProfile Diamond() {
  return MakeProfile(5, 5, 0,
                     {{0, 100, 2, 7, 8, {}},
                      {1, 200, 3, 6, 7, {0}},
                      {2, 300, 3, 6, 7, {0}},
                      {3, 50, 4, 5, 6, {1, 2}},
                      {4, 400, 4, 5, 5, {3}}});
}

// x -> f1 -> f2 -> add(x, f2) -> head; 5 forward nodes, 5 backward steps.
inline PlanProfile Residual() {
  return MakeProfile(5, 5, 0,
                     {{0, 100, 3, 8, 8, {}},
                      {1, 200, 2, 7, 7, {0}},
                      {2, 300, 3, 6, 6, {1}},
                      {3, 400, 4, 5, 5, {0, 2}},
                      {4, 50, 4, 5, 5, {3}}});
}

// A random DAG of `n` op nodes, each producing one activation: node i reads
// node i-1 and sometimes an earlier node (a skip connection). Backward step
// k differentiates node n-1-k; an activation is first needed by the earliest
// backward step of its consumers and itself, and last by its own.
inline PlanProfile RandomProfile(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int64_t> size(1, 100);
  std::uniform_real_distribution<double> ms(0.5, 5.0);
  std::uniform_real_distribution<double> coin(0, 1);
  std::vector<std::vector<int>> inputs(n);
  for (int i = 1; i < n; ++i) {
    inputs[i].push_back(i - 1);
    if (i >= 2 && coin(rng) < 0.3) {
      inputs[i].push_back(std::uniform_int_distribution<int>(0, i - 2)(rng));
    }
  }
  PlanProfile p;
  p.nodes.resize(n);
  p.backward_steps.resize(n);
  for (int i = 0; i < n; ++i) {
    p.nodes[i].forward_ms = ms(rng);
    p.backward_steps[i].ms = 2 * ms(rng);
    p.backward_steps[i].forward_node = n - 1 - i;
  }
  auto grad_pos = [n](int node) { return n + (n - 1 - node); };
  p.fixed_bytes = size(rng) * 1000;
  for (int i = 0; i < n; ++i) {
    PlanActivation a;
    a.value_id = i;
    a.producer_node = i;
    a.size_bytes = size(rng) * 1000;
    a.last_forward_use = i;
    a.first_backward_use = grad_pos(i);
    for (int c = i + 1; c < n; ++c) {
      if (std::find(inputs[c].begin(), inputs[c].end(), i) != inputs[c].end()) {
        a.last_forward_use = c;
        a.first_backward_use = std::min(a.first_backward_use, grad_pos(c));
      }
    }
    a.last_backward_use = grad_pos(i);
    a.recompute_sources = inputs[i];
    a.recompute_nodes = {i};
    a.recompute_ms = p.nodes[i].forward_ms;
    p.activations.push_back(a);
  }
  double t = 0;
  for (const auto& node : p.nodes) t += node.forward_ms;
  for (const auto& s : p.backward_steps) t += s.ms;
  p.measured_iteration_ms = t;
  for (auto& a : p.activations) {
    double inactive = 0;
    for (int pos = a.last_forward_use + 1; pos < a.first_backward_use; ++pos) {
      inactive +=
          pos < n ? p.nodes[pos].forward_ms : p.backward_steps[pos - n].ms;
    }
    a.inactive_ms = inactive;
  }
  return p;
}

// RandomProfile plus what the bench shape lacks: nodes producing two
// activations, non-op nodes (their activations cannot join a segment), op
// nodes without activations (they neither join nor split a segment),
// zero-size activations, allocator figures on odd graphs and links slow
// enough that offloads queue behind each other.
inline PlanProfile RichRandomProfile(std::mt19937& rng, int n) {
  PlanProfile p = RandomProfile(rng, n);
  std::uniform_real_distribution<double> coin(0, 1);
  const int base = static_cast<int>(p.activations.size());
  // Node i's activation moved to node i-1: node i produces nothing.
  for (int i = 1; i < base; ++i) {
    if (coin(rng) < 0.1) p.activations[i].producer_node = i - 1;
  }
  for (int i = 0; i < base; ++i) {
    if (coin(rng) < 0.2) {
      PlanActivation extra = p.activations[i];
      extra.value_id = 1000 + i;
      extra.size_bytes = static_cast<int64_t>(coin(rng) * 50000);
      extra.recompute_sources = {i};
      p.activations.push_back(extra);
    }
  }
  for (int i = 0; i < n; ++i) {
    if (coin(rng) < 0.1) p.nodes[i].is_op = false;
  }
  for (PlanActivation& a : p.activations) {
    if (coin(rng) < 0.05) a.size_bytes = 0;
  }
  if (coin(rng) < 0.5) {
    std::uniform_int_distribution<int64_t> extra(0, 200000);
    int64_t after = p.fixed_bytes;
    for (PlanNode& node : p.nodes) {
      after += extra(rng) / 4;
      node.allocated_bytes_after = after;
      node.peak_bytes_during = after + extra(rng);
      node.transient_bytes = extra(rng);
    }
    for (PlanBackwardStep& step : p.backward_steps) {
      after = std::max<int64_t>(p.fixed_bytes, after - extra(rng) / 4);
      step.allocated_bytes_after = after;
      step.peak_bytes_during = after + extra(rng);
    }
  }
  const double bandwidth = 1e6 * (5 + 200 * coin(rng));  // bytes per second
  p.host_to_device_bytes_per_second = bandwidth;
  p.device_to_host_bytes_per_second = bandwidth * (0.5 + coin(rng));
  return p;
}

// A deep residual network shaped like torchvision's ResNet-152 on a GPU:
// `blocks` bottleneck blocks (conv, bn, relu, conv, bn, relu, conv, bn, add,
// relu: 10 op nodes, each producing one activation; the add also reads the
// block's input), one backward step per node in reverse order (twice the
// forward time), forward time proportional to the activation's size, one
// scope per block ("layer1.0" style, for per_block) and links on which
// offloading every activation takes half the iteration (1.5 times the
// forward pass): offloads queue up during the forward pass, as on ResNet-152
// batch 64 with ~8 GiB of activations at ~55 GB/s. ResNet-152 has 50 such
// blocks. Without allocator figures (the curve is fixed memory + live
// activations).
inline PlanProfile DeepResidualProfile(int blocks) {
  constexpr int kPerBlock = 10;
  const int n = blocks * kPerBlock;
  // Per node in the block: relative size (the expanding conv3/bn3/add/relu
  // are 4x the bottleneck width, as in ResNet's bottleneck).
  constexpr int64_t kUnit = 1 << 20;
  const int64_t rel[kPerBlock] = {1, 1, 1, 1, 1, 1, 4, 4, 4, 4};
  PlanProfile p;
  p.nodes.resize(n);
  p.backward_steps.resize(n);
  std::vector<std::vector<int>> inputs(n);
  for (int i = 0; i < n; ++i) {
    const int block = i / kPerBlock, k = i % kPerBlock;
    p.nodes[i].forward_ms = 0.01 * static_cast<double>(rel[k]);
    p.nodes[i].scope = "layer" + std::to_string(1 + block / 12) + "." +
                       std::to_string(block % 12) + ".n" + std::to_string(k);
    if (i > 0) inputs[i].push_back(i - 1);
    // The add reads the block input (the previous block's last relu).
    if (k == 8 && block > 0) inputs[i].push_back(block * kPerBlock - 1);
  }
  for (int i = 0; i < n; ++i) {
    p.backward_steps[i].forward_node = n - 1 - i;
    p.backward_steps[i].ms = 2 * p.nodes[n - 1 - i].forward_ms;
  }
  auto grad_pos = [n](int node) { return n + (n - 1 - node); };
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    PlanActivation a;
    a.value_id = i;
    a.producer_node = i;
    a.size_bytes = rel[i % kPerBlock] * kUnit;
    total += a.size_bytes;
    a.last_forward_use = i;
    a.first_backward_use = grad_pos(i);
    for (int c = i + 1; c < n && c <= i + kPerBlock; ++c) {
      if (std::find(inputs[c].begin(), inputs[c].end(), i) != inputs[c].end()) {
        a.last_forward_use = c;
        a.first_backward_use = std::min(a.first_backward_use, grad_pos(c));
      }
    }
    a.last_backward_use = grad_pos(i);
    a.recompute_sources = inputs[i];
    a.recompute_nodes = {i};
    a.recompute_ms = p.nodes[i].forward_ms;
    p.activations.push_back(a);
  }
  std::vector<double> end(2 * n);
  double t = 0;
  for (int pos = 0; pos < 2 * n; ++pos) {
    t += pos < n ? p.nodes[pos].forward_ms : p.backward_steps[pos - n].ms;
    end[pos] = t;
  }
  p.measured_iteration_ms = t;
  for (PlanActivation& a : p.activations) {
    a.inactive_ms = end[a.first_backward_use - 1] - end[a.last_forward_use];
  }
  p.fixed_bytes = total / 10;
  const double bandwidth = static_cast<double>(total) / (0.5 * t / 1000);
  p.host_to_device_bytes_per_second = bandwidth;
  p.device_to_host_bytes_per_second = bandwidth;
  for (PlanActivation& a : p.activations) {
    a.swap_ms = 2000.0 * static_cast<double>(a.size_bytes) / bandwidth;
  }
  return p;
}

}  // namespace mutwo::planner::testing

#endif  // MUTWO_TESTS_PLANNER_TEST_PROFILES_H_
