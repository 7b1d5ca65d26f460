// planner_bench: how long the μ-TWO planner takes on synthetic training
// graphs of 1k, 5k and 20k forward nodes (one plan at 60% of the baseline
// peak, a 20-point Pareto sweep, one simulation), printed as JSON.
//
// Graph: a residual network shape. 80% of the nodes are tensor ops that
// produce an activation (the rest are attribute reads and constants); every
// op reads its predecessor, every 4th also an op 3-12 nodes back (a skip
// connection); one backward step per op in reverse order; activations are
// first needed by the backward step of their latest consumer and freed after
// their own. Sizes 0.5-8 MiB, forward 0.05-1 ms, backward twice that,
// 25 GB/s host<->device. Deterministic (seeded).
//
// Timed: Planner::Create (create_ms: simulator and policy set-up), one plan
// at 60% including the trajectory to the floor (plan_ms), the same without
// the floor (plan_without_floor_ms), a 20-point Pareto sweep on a fresh
// planner (pareto_20_ms, creation not included) and one full simulation.
// --reference also plans with Planner::Options::incremental off (every round
// re-simulates the whole timeline), reports its time and fails unless both
// trajectories are identical step by step (activation, action, prefetch
// position, peak, time) and give the same plan.
//
// Usage: planner_bench [--nodes=1000,5000,20000] [--repeats=3] [--reference]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "planner/planner.h"
#include "planner/simulator.h"

namespace mutwo::planner {
namespace {

PlanProfile SyntheticProfile(int nodes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> ms(0.05, 1.0);
  std::uniform_int_distribution<int64_t> size(512 << 10, 8 << 20);
  std::uniform_int_distribution<int> back(3, 12);
  std::uniform_real_distribution<double> coin(0, 1);
  PlanProfile p;
  p.nodes.resize(nodes);
  std::vector<int> ops;
  for (int i = 0; i < nodes; ++i) {
    p.nodes[i].is_op = coin(rng) < 0.8;
    p.nodes[i].forward_ms = p.nodes[i].is_op ? ms(rng) : 0.001;
    p.nodes[i].scope = "block" + std::to_string(i / 50) + ".op";
    if (p.nodes[i].is_op) ops.push_back(i);
  }
  const int n_ops = static_cast<int>(ops.size());
  // Backward step k differentiates ops[n_ops - 1 - k].
  p.backward_steps.resize(n_ops);
  std::vector<int> grad_pos(nodes, -1);
  for (int k = 0; k < n_ops; ++k) {
    const int node = ops[n_ops - 1 - k];
    p.backward_steps[k].forward_node = node;
    p.backward_steps[k].ms = 2 * p.nodes[node].forward_ms;
    grad_pos[node] = nodes + k;
  }
  std::vector<std::vector<int>> inputs(n_ops);
  for (int j = 1; j < n_ops; ++j) {
    inputs[j].push_back(j - 1);
    if (j % 4 == 0 && j >= 12) inputs[j].push_back(j - back(rng));
  }
  std::vector<int> last_consumer(n_ops, -1);
  for (int j = 0; j < n_ops; ++j) {
    for (int i : inputs[j]) last_consumer[i] = std::max(last_consumer[i], j);
  }
  p.fixed_bytes = int64_t{512} << 20;
  for (int j = 0; j < n_ops; ++j) {
    const int node = ops[j];
    PlanActivation a;
    a.value_id = j;
    a.producer_node = node;
    a.size_bytes = size(rng);
    const int consumer = last_consumer[j] < 0 ? j : last_consumer[j];
    a.last_forward_use = ops[consumer];
    a.first_backward_use = grad_pos[ops[consumer]];
    a.last_backward_use = grad_pos[node];
    a.recompute_sources = inputs[j];
    a.recompute_nodes = {node};
    a.recompute_ms = p.nodes[node].forward_ms;
    a.swap_ms = 2000.0 * a.size_bytes / 25e9;
    p.activations.push_back(a);
  }
  p.host_to_device_bytes_per_second = 25e9;
  p.device_to_host_bytes_per_second = 25e9;
  std::vector<double> end(p.positions());
  double t = 0;
  for (int i = 0; i < p.positions(); ++i) {
    t += i < nodes ? p.nodes[i].forward_ms : p.backward_steps[i - nodes].ms;
    end[i] = t;
  }
  p.measured_iteration_ms = t;
  for (PlanActivation& a : p.activations) {
    a.inactive_ms = end[a.first_backward_use - 1] - end[a.last_forward_use];
  }
  return p;
}

double Ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - since)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace mutwo::planner

int main(int argc, char** argv) {
  using mutwo::planner::Planner;
  std::vector<int> sizes = {1000, 5000, 20000};
  int repeats = 3;
  bool reference = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--reference") {
      reference = true;
    } else if (absl::ConsumePrefix(&arg, "--nodes=")) {
      sizes.clear();
      for (absl::string_view s : absl::StrSplit(arg, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(s, &n) || n < 10) {
          std::fprintf(stderr, "planner_bench: bad --nodes value \"%s\"\n",
                       std::string(s).c_str());
          return 2;
        }
        sizes.push_back(n);
      }
    } else if (absl::ConsumePrefix(&arg, "--repeats=")) {
      if (!absl::SimpleAtoi(arg, &repeats) || repeats < 1) {
        std::fprintf(stderr, "planner_bench: bad --repeats\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: planner_bench [--nodes=1000,5000,20000] "
                   "[--repeats=3] [--reference]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  std::printf("{\"benchmark\": \"planner\", \"repeats\": %d, \"results\": [\n",
              repeats);
  for (size_t s = 0; s < sizes.size(); ++s) {
    const auto profile = mutwo::planner::SyntheticProfile(sizes[s], 42);
    std::vector<double> create_ms, sim_ms, plan_ms, lazy_ms, pareto_ms;
    size_t lazy_steps = 0;
    mutwo::planner::PlanResult result;
    size_t pareto_points = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto planner = *Planner::Create(profile, Planner::Options{});
      create_ms.push_back(mutwo::planner::Ms(t0));
      t0 = std::chrono::steady_clock::now();
      const int64_t budget =
          planner->simulator().baseline_peak_bytes() * 6 / 10;
      result = planner->Plan(budget);
      plan_ms.push_back(mutwo::planner::Ms(t0));

      Planner::Options lazy_options;
      lazy_options.compute_floor = false;
      auto lazy = *Planner::Create(profile, lazy_options);
      t0 = std::chrono::steady_clock::now();
      const auto lazy_result = lazy->Plan(budget);
      lazy_ms.push_back(mutwo::planner::Ms(t0));
      lazy_steps = lazy->Trajectory(0).size();  // extends it to the floor
      if (lazy_result.sim.peak_bytes != result.sim.peak_bytes) {
        std::fprintf(stderr, "planner_bench: lazy plan differs\n");
        return 1;
      }

      auto sweep = *Planner::Create(profile, Planner::Options{});
      t0 = std::chrono::steady_clock::now();
      pareto_points = sweep->Pareto(20).size();
      pareto_ms.push_back(mutwo::planner::Ms(t0));

      t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 20; ++k) {
        (void)planner->simulator().Run(result.decisions);
      }
      sim_ms.push_back(mutwo::planner::Ms(t0) / 20);
    }
    double reference_ms = -1;
    if (reference) {
      Planner::Options full_options;
      full_options.incremental = false;
      auto full = *Planner::Create(profile, full_options);
      auto t0 = std::chrono::steady_clock::now();
      const auto full_result =
          full->Plan(full->simulator().baseline_peak_bytes() * 6 / 10);
      reference_ms = mutwo::planner::Ms(t0);
      auto fast = *Planner::Create(profile, Planner::Options{});
      const auto& a = fast->Trajectory(0);
      const auto& b = full->Trajectory(0);
      bool same = a.size() == b.size();
      for (size_t i = 0; same && i < a.size(); ++i) {
        same = a[i].activation == b[i].activation &&
               a[i].action == b[i].action &&
               a[i].prefetch_at == b[i].prefetch_at &&
               a[i].peak_bytes == b[i].peak_bytes &&
               a[i].iteration_ms == b[i].iteration_ms;
      }
      for (size_t c = 0; same && c < result.decisions.size(); ++c) {
        same = result.decisions[c].action == full_result.decisions[c].action &&
               result.decisions[c].prefetch_at ==
                   full_result.decisions[c].prefetch_at;
      }
      if (!same) {
        std::fprintf(stderr,
                     "planner_bench: incremental and reference trajectories "
                     "differ at %d nodes\n",
                     sizes[s]);
        return 1;
      }
    }
    std::printf(
        "  {\"nodes\": %d, \"activations\": %zu, \"positions\": %d,\n"
        "   \"create_ms\": %.2f, \"simulate_ms\": %.3f, \"plan_ms\": %.2f, "
        "\"plan_without_floor_ms\": %.2f, \"trajectory_steps\": %zu,\n"
        "   \"pareto_20_ms\": %.2f, \"pareto_points\": %zu,\n"
        "   \"budget_fraction\": 0.6, \"feasible\": %s, "
        "\"baseline_peak_bytes\": %lld, \"predicted_peak_bytes\": %lld,\n"
        "   \"overhead\": %.4f, \"recomputed\": %d, \"swapped\": %d, "
        "\"probes\": %d, \"simulations\": %lld, \"bounded\": %s%s}%s\n",
        sizes[s], profile.activations.size(), profile.positions(),
        mutwo::planner::Median(create_ms), mutwo::planner::Median(sim_ms),
        mutwo::planner::Median(plan_ms), mutwo::planner::Median(lazy_ms),
        lazy_steps, mutwo::planner::Median(pareto_ms), pareto_points,
        result.feasible ? "true" : "false",
        static_cast<long long>(result.baseline_peak_bytes),
        static_cast<long long>(result.sim.peak_bytes),
        result.sim.iteration_ms / result.baseline_iteration_ms - 1,
        result.sim.recomputed, result.sim.swapped, result.probes,
        static_cast<long long>(result.simulations),
        result.bounded ? "true" : "false",
        reference ? absl::StrFormat(",\n   \"reference_plan_ms\": %.2f, "
                                    "\"same_as_reference\": true",
                                    reference_ms)
                        .c_str()
                  : "",
        s + 1 < sizes.size() ? "," : "");
    std::fflush(stdout);
  }
  std::printf("]}\n");
  return 0;
}
