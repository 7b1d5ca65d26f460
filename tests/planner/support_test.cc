// Baselines, Pareto helpers, the exact oracle and max batch size.
#include <gtest/gtest.h>

#include "server/planner/baselines.h"
#include "server/planner/max_batch.h"
#include "server/planner/oracle.h"
#include "server/planner/pareto.h"
#include "server/planner/simulator.h"
#include "tests/planner/test_profiles.h"

namespace mutwo::planner {
namespace {

int Count(const Decisions& d, Action action) {
  int n = 0;
  for (const Decision& x : d) n += x.action == action;
  return n;
}

TEST(BaselinesTest, SqrtNKeepsOneActivationPerSegment) {
  std::mt19937 rng(1);
  PlanProfile p = testing::RandomProfile(rng, 16);
  Decisions d = SqrtNCheckpointing(p);
  EXPECT_EQ(Count(d, Action::kRecompute), 12);
  for (int i : {3, 7, 11, 15}) EXPECT_EQ(d[i].action, Action::kRetain) << i;
  // Non-op nodes neither count nor get decisions of their own.
  p.nodes[3].is_op = false;
  EXPECT_EQ(Count(SqrtNCheckpointing(p), Action::kRecompute), 11);
}

TEST(BaselinesTest, PerBlockRetainsEachBlockOutput) {
  EXPECT_EQ(TopLevelBlock("layer1.0.conv1"), "layer1.0");
  EXPECT_EQ(TopLevelBlock("layer1.conv1"), "layer1");
  EXPECT_EQ(TopLevelBlock("fc"), "fc");
  EXPECT_EQ(TopLevelBlock(""), "");
  std::mt19937 rng(2);
  PlanProfile p = testing::RandomProfile(rng, 7);
  const char* scopes[] = {"",           "layer1.0.a", "layer1.0.b",
                          "layer1.1.a", "layer1.1.b", "layer1.1.c",
                          "fc"};
  for (int i = 0; i < 7; ++i) p.nodes[i].scope = scopes[i];
  Decisions d = PerBlockCheckpointing(p);
  const Action want[] = {Action::kRetain,    Action::kRecompute,
                         Action::kRetain,    Action::kRecompute,
                         Action::kRecompute, Action::kRetain,
                         Action::kRetain};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(d[i].action, want[i]) << i;
  auto sim = Simulator::Create(&p);
  ASSERT_TRUE(sim.ok());
  EXPECT_LT((*sim)->Run(d).peak_bytes, (*sim)->baseline_peak_bytes());
}

TEST(ParetoTest, SweepAndFrontier) {
  std::vector<int64_t> b = BudgetSweep(100, 1000, 20);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(b.front(), 100);
  EXPECT_EQ(b.back(), 1000);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(BudgetSweep(5, 8, 20).size(), 4u);
  std::vector<ParetoPoint> f = NonDominated({{0, 10, 5.0, 0, 0},
                                             {0, 12, 5.0, 0, 0},
                                             {0, 8, 7.0, 0, 0},
                                             {0, 9, 8.0, 0, 0},
                                             {0, 20, 1.0, 0, 0}});
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].predicted_peak_bytes, 8);
  EXPECT_EQ(f[1].predicted_peak_bytes, 10);
  EXPECT_EQ(f[2].predicted_peak_bytes, 20);
}

TEST(OracleTest, FindsTheCheapestFittingSubset) {
  // Chain: only A can be freed at the peak.
  const PlanProfile p = testing::Chain();
  auto sim = Simulator::Create(&p);
  ASSERT_TRUE(sim.ok());
  auto r = SolveExactly(**sim, 1500);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->feasible);
  EXPECT_EQ(r->schedules_simulated, 8);
  EXPECT_EQ(r->floor_bytes, 1500);
  EXPECT_EQ(Count(r->decisions, Action::kRecompute), 1);
  EXPECT_EQ(r->decisions[0].action, Action::kRecompute);
  EXPECT_FALSE(SolveExactly(**sim, 1499)->feasible);
  std::mt19937 rng(3);
  const PlanProfile big = testing::RandomProfile(rng, 21);
  auto big_sim = Simulator::Create(&big);
  EXPECT_FALSE(SolveExactly(**big_sim, 1).ok());
}

// Profiles of one chain at batch size b: every activation and the fixed
// memory scale with b, times too.
PlanProfile ChainAt(int64_t batch) {
  PlanProfile p = testing::MakeProfile(3, 3, 1000 + 10 * batch,
                                       {{0, 100 * batch, 1, 5, 5, {}},
                                        {1, 200 * batch, 2, 4, 4, {0}},
                                        {2, 300 * batch, 2, 3, 3, {1}}});
  for (auto& n : p.nodes) n.forward_ms = batch;
  for (auto& s : p.backward_steps) s.ms = 2.0 * batch;
  for (auto& a : p.activations) a.recompute_ms = batch;
  return p;
}

TEST(MaxBatchTest, FitsLinesAndPredictsBothLimits) {
  std::vector<BatchProfile> profiles = {{2, ChainAt(2)}, {4, ChainAt(4)}};
  auto extrapolated = ExtrapolateProfile(profiles, 10);
  ASSERT_TRUE(extrapolated.ok());
  EXPECT_EQ(extrapolated->activations[1].size_bytes, 2000);
  EXPECT_EQ(extrapolated->fixed_bytes, 1100);
  // Baseline peak = 1000 + 610 b; with A recomputed: 1000 + 510 b.
  MaxBatchOptions options;
  options.capacity_bytes = 1000 + 610 * 20;
  options.max_overhead = 1.0;
  auto r = PredictMaxBatch(profiles, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_batch_without_checkpointing, 20);
  EXPECT_EQ(r->max_batch_with_schedule, (610 * 20) / 510);
  EXPECT_DOUBLE_EQ(r->bytes_per_sample, 610);
  EXPECT_EQ(r->bytes_intercept, 1000);
  EXPECT_EQ(r->verify_batch_sizes, (std::vector<int64_t>{20, 23}));
  // Recomputing A adds b ms to a 9b ms step (+11%): with no overhead
  // allowed the schedule's batch is the baseline's.
  options.max_overhead = 0;
  EXPECT_EQ(PredictMaxBatch(profiles, options)->max_batch_with_schedule, 20);
}

TEST(MaxBatchTest, RejectsBadInput) {
  MaxBatchOptions options;
  options.capacity_bytes = 1 << 20;
  EXPECT_FALSE(PredictMaxBatch({{2, ChainAt(2)}}, options).ok());
  EXPECT_FALSE(
      PredictMaxBatch({{2, ChainAt(2)}, {2, ChainAt(2)}}, options).ok());
  PlanProfile other = ChainAt(4);
  other.activations[0].last_forward_use = 2;
  auto r = PredictMaxBatch({{2, ChainAt(2)}, {4, other}}, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("different graphs"), std::string::npos);
  options.capacity_bytes = 0;
  EXPECT_FALSE(
      PredictMaxBatch({{2, ChainAt(2)}, {4, ChainAt(4)}}, options).ok());
}

}  // namespace
}  // namespace mutwo::planner
