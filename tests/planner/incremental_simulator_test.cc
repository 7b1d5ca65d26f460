#include "planner/incremental_simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/planner/test_profiles.h"

namespace mutwo::planner {
namespace {

// Every quantity the policy reads from the incremental simulator, compared
// with a full re-simulation of the same decisions.
void ExpectSameAsFullSimulation(const Simulator& sim,
                                const IncrementalSimulator& inc,
                                const std::string& where) {
  Simulator::Options options;
  options.time_model = false;
  const SimResult full = sim.Run(inc.decisions(), options);
  ASSERT_EQ(inc.peak_bytes(), full.peak_bytes) << where;
  ASSERT_EQ(inc.peak_position(), full.peak_position) << where;
  ASSERT_EQ(inc.iteration_ms(), full.iteration_ms) << where;  // exact
  ASSERT_EQ(inc.recompute_ms(), full.recompute_ms) << where;
  ASSERT_EQ(inc.segments(), full.segments) << where;
  for (int t = 0; t < sim.positions(); ++t) {
    ASSERT_EQ(inc.planned_peak_bytes(t), full.planned_peak_bytes[t])
        << where << " position " << t;
  }
  std::vector<double> replay_ms(sim.positions(), 0);
  for (const auto& [at, ms] : full.replays) replay_ms[at] += ms;
  for (int t = 0; t < sim.positions(); ++t) {
    ASSERT_EQ(inc.replay_ms_at(t), replay_ms[t]) << where << " position " << t;
  }
  std::vector<std::vector<int>> swaps_needed(sim.positions());
  for (size_t a = 0; a < inc.decisions().size(); ++a) {
    if (inc.decisions()[a].action == Action::kSwap) {
      swaps_needed[full.needed_at[a]].push_back(static_cast<int>(a));
    }
  }
  for (int t = 0; t < sim.positions(); ++t) {
    std::vector<int> listed = inc.swaps_needed_at(t);
    std::sort(listed.begin(), listed.end());
    ASSERT_EQ(listed, swaps_needed[t]) << where << " position " << t;
  }
  for (size_t a = 0; a < inc.decisions().size(); ++a) {
    ASSERT_EQ(inc.needed_at(static_cast<int>(a)), full.needed_at[a])
        << where << " activation " << a;
    ASSERT_EQ(inc.offload_done_at(static_cast<int>(a)), full.offload_done_at[a])
        << where << " activation " << a;
  }
}

TEST(IncrementalSimulatorTest, MatchesTheFullSimulationAfterEveryChange) {
  std::mt19937 rng(20240611);
  std::mt19937 host_rng(7);
  std::uniform_real_distribution<double> host_ms(0, 3);
  for (int g = 0; g < 60; ++g) {
    PlanProfile p = testing::RichRandomProfile(rng, 10 + g % 30);
    // Odd graphs: replays bound by the host on some nodes, and a per-segment
    // overhead (what a CUDA profile carries).
    if (g % 2 == 1) {
      for (PlanNode& node : p.nodes) node.host_ms = host_ms(host_rng);
      p.replay_overhead_ms = 0.25;
    }
    auto sim = Simulator::Create(&p);
    ASSERT_TRUE(sim.ok()) << sim.status();
    auto inc = IncrementalSimulator::Create(sim->get());
    ASSERT_TRUE(inc.ok()) << inc.status();
    ExpectSameAsFullSimulation(**sim, **inc, absl::StrCat("graph ", g));
    const int a_count = static_cast<int>(p.activations.size());
    std::uniform_int_distribution<int> pick(0, a_count - 1);
    std::uniform_int_distribution<int> action(0, 5);
    std::uniform_int_distribution<int> position(-1, p.positions() - 1);
    for (int change = 0; change < 120; ++change) {
      const int a = pick(rng);
      Decision d;
      const int r = action(rng);
      // Mostly adds (as the policy does), sometimes back to RETAIN (undo).
      d.action = r < 2   ? Action::kRecompute
                 : r < 4 ? Action::kSwap
                         : Action::kRetain;
      if (d.action == Action::kSwap) d.prefetch_at = position(rng);
      (*inc)->Set(a, d);
      ExpectSameAsFullSimulation(
          **sim, **inc,
          absl::StrCat("graph ", g, " change ", change, " activation ", a,
                       " -> ", ActionName(d.action)));
      if (::testing::Test::HasFatalFailure()) return;
    }
    (*inc)->Reset();
    ExpectSameAsFullSimulation(**sim, **inc,
                               absl::StrCat("graph ", g, " after Reset"));
  }
}

TEST(IncrementalSimulatorTest, SegmentsMergeAndSplitLikeTheFullSimulation) {
  // Chain of 6: recomputing 1, 3, then 2 merges two segments into one; back
  // to RETAIN splits it again.
  const PlanProfile p = testing::MakeProfile(6, 6, 0,
                                             {{0, 100, 1, 11, 11, {}},
                                              {1, 100, 2, 10, 10, {0}},
                                              {2, 100, 3, 9, 9, {1}},
                                              {3, 100, 4, 8, 8, {2}},
                                              {4, 100, 5, 7, 7, {3}},
                                              {5, 100, 5, 6, 6, {4}}});
  auto sim = Simulator::Create(&p);
  ASSERT_TRUE(sim.ok());
  auto inc = IncrementalSimulator::Create(sim->get());
  ASSERT_TRUE(inc.ok());
  Decision recompute;
  recompute.action = Action::kRecompute;
  (*inc)->Set(1, recompute);
  (*inc)->Set(3, recompute);
  EXPECT_EQ((*inc)->segments(), 2);
  (*inc)->Set(2, recompute);
  EXPECT_EQ((*inc)->segments(), 1);
  EXPECT_EQ((*inc)->needed_at(1), 8);  // earliest first backward use
  EXPECT_DOUBLE_EQ((*inc)->recompute_ms(), 3);
  ExpectSameAsFullSimulation(**sim, **inc, "merged");
  (*inc)->Set(2, Decision{});
  EXPECT_EQ((*inc)->segments(), 2);
  EXPECT_EQ((*inc)->needed_at(1), 10);
  ExpectSameAsFullSimulation(**sim, **inc, "split");
}

// The executor replays a segment's whole node range, so a node inside it
// that is no member's lineage (a mask made from the input, Swin's window
// partition) costs its forward time again: A (node 0) and C (node 2) are
// one segment around node 1, which produced no activation.
TEST(IncrementalSimulatorTest, AReplayCostsItsWholeNodeRange) {
  PlanProfile p = testing::MakeProfile(
      4, 4, 0,
      {{0, 100, 2, 6, 6, {}}, {2, 100, 3, 5, 5, {0}}, {3, 100, 3, 4, 4, {1}}});
  p.nodes[1].forward_ms = 10;
  auto sim = Simulator::Create(&p);
  ASSERT_TRUE(sim.ok()) << sim.status();
  Decisions d(3);
  d[0].action = Action::kRecompute;
  d[1].action = Action::kRecompute;
  const SimResult full = (*sim)->Run(d);
  EXPECT_EQ(full.segments, 1);
  EXPECT_DOUBLE_EQ(full.recompute_ms, 1 + 10 + 1);
  EXPECT_DOUBLE_EQ(full.iteration_ms, (*sim)->baseline_iteration_ms() + 12);
  auto inc = IncrementalSimulator::Create(sim->get());
  ASSERT_TRUE(inc.ok()) << inc.status();
  (*inc)->Set(0, d[0]);
  (*inc)->Set(1, d[1]);
  EXPECT_DOUBLE_EQ((*inc)->recompute_ms(), 12);
  ExpectSameAsFullSimulation(**sim, **inc, "range");
}

}  // namespace
}  // namespace mutwo::planner
