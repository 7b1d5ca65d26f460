// Baselines, Pareto helpers, the exact oracle and max batch size.
#include <gtest/gtest.h>

#include "planner/baselines.h"
#include "planner/max_batch.h"
#include "planner/oracle.h"
#include "planner/pareto.h"
#include "planner/simulator.h"
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

// The knee: the point farthest below the chord from the lowest peak to the
// fastest point, both axes scaled to [0, 1].
TEST(ParetoTest, KneeIsFarthestBelowTheChord) {
  EXPECT_EQ(KneeIndex({}), -1);
  EXPECT_EQ(KneeIndex({{0, 10, 5.0, 0, 0}}), 0);
  // Saving the first half of the memory costs little, the rest a lot:
  // peak 100 -> 60 costs 1 ms, 60 -> 20 costs 20 ms.
  const std::vector<ParetoPoint> bent = {{0, 20, 31.0, 0, 0},
                                         {0, 40, 20.0, 0, 0},
                                         {0, 60, 11.0, 0, 0},
                                         {0, 80, 10.5, 0, 0},
                                         {0, 100, 10.0, 0, 0}};
  EXPECT_EQ(KneeIndex(bent), 2);
  // A straight trade-off has no knee: the lowest peak.
  EXPECT_EQ(
      KneeIndex(
          {{0, 10, 30.0, 0, 0}, {0, 20, 20.0, 0, 0}, {0, 30, 10.0, 0, 0}}),
      0);
  // Memory for free (equal times): the lowest peak.
  EXPECT_EQ(KneeIndex({{0, 10, 5.0, 0, 0}, {0, 30, 5.0, 0, 0}}), 0);
  // Scale does not matter: bytes in GiB, times in seconds.
  std::vector<ParetoPoint> scaled = bent;
  for (ParetoPoint& p : scaled) {
    p.predicted_peak_bytes <<= 30;
    p.predicted_iteration_ms *= 1000;
  }
  EXPECT_EQ(KneeIndex(scaled), 2);
}

// The budget `auto` resolves to, always one of the curve's budgets: at a
// sharp knee the knee's; where three points score nearly the same, the
// middle one, whichever of them noise makes a hair better.
TEST(ParetoTest, KneeBudgetIsTheMiddleOfThePointsNearTheBest) {
  EXPECT_EQ(KneeBudget({}), -1);
  EXPECT_EQ(KneeBudget({{1000, 900, 5.0, 0, 0}}), 1000);
  const int64_t mib = int64_t{1} << 20;
  const std::vector<ParetoPoint> bent = {{20 * mib, 20 * mib, 31.0, 0, 0},
                                         {40 * mib, 40 * mib, 20.0, 0, 0},
                                         {60 * mib, 60 * mib, 11.0, 0, 0},
                                         {80 * mib, 80 * mib, 10.5, 0, 0},
                                         {100 * mib, 100 * mib, 10.0, 0, 0}};
  EXPECT_EQ(KneeBudget(bent), 60 * mib);
  // Scores 1, 0.9, 0.9, 0.9, 1 (peaks 0.4, 0.5, 0.6 plus times 0.5, 0.4,
  // 0.3): the 50 MiB point, also with either neighbour a hair better.
  std::vector<ParetoPoint> flat = {{0, 0, 30.0, 0, 0},
                                   {40 * mib, 40 * mib, 15.0, 0, 0},
                                   {50 * mib, 50 * mib, 12.0, 0, 0},
                                   {60 * mib, 60 * mib, 9.0, 0, 0},
                                   {100 * mib, 100 * mib, 0.0, 0, 0}};
  EXPECT_EQ(KneeIndex(flat), 1);  // the arg-min: the lowest peak of a tie
  EXPECT_EQ(KneeBudget(flat), 50 * mib);
  for (const double ms : {14.8, 15.2}) {
    flat[1].predicted_iteration_ms = ms;
    EXPECT_EQ(KneeBudget(flat), 50 * mib) << ms;
  }
  flat[1].predicted_iteration_ms = 15.0;
  for (const double ms : {8.8, 9.2}) {
    flat[3].predicted_iteration_ms = ms;
    EXPECT_EQ(KneeBudget(flat), 50 * mib) << ms;
  }
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

TEST(MaxBatchTest, MarginCoversMeasuredFragmentationAndReserve) {
  std::vector<BatchProfile> profiles = {{2, ChainAt(2)}, {4, ChainAt(4)}};
  MaxBatchOptions options;
  options.capacity_bytes = 1000 + 610 * 20;
  options.max_overhead = 1.0;
  auto plain = PredictMaxBatch(profiles, options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->max_batch_without_checkpointing, 20);
  // The allocator measured 10% over the simulated peak at batch 4: every
  // predicted peak grows by 10%, and a reserve comes off the capacity.
  for (BatchProfile& bp : profiles) {
    auto sim = Simulator::Create(&bp.profile);
    ASSERT_TRUE(sim.ok());
    bp.profile.measured_peak_bytes = static_cast<int64_t>(
        1.1 * static_cast<double>((*sim)->baseline_peak_bytes()));
  }
  options.reserve_bytes = 500;
  auto margin = PredictMaxBatch(profiles, options);
  ASSERT_TRUE(margin.ok()) << margin.status();
  EXPECT_NEAR(margin->fragmentation_fraction, 0.1, 1e-3);
  EXPECT_EQ(margin->reserve_bytes, 500);
  // 1000 + 610 b <= (13200 - 500) / 1.1 = 11545: b <= 17.
  EXPECT_EQ(margin->max_batch_without_checkpointing, 17);
  // With A recomputed (1000 + 510 b) the schedule is planned for
  // 11545 bytes too: b <= 20 (22 with the reserve alone, 23 without).
  EXPECT_EQ(margin->max_batch_with_schedule, 20);
  EXPECT_EQ(plain->max_batch_with_schedule, 23);
  EXPECT_DOUBLE_EQ(margin->extrapolation,
                   margin->max_batch_with_schedule / 4.0);
  EXPECT_NE(margin->reason.find("extrapolated"), std::string::npos)
      << margin->reason;
  options.reserve_bytes = options.capacity_bytes;
  EXPECT_FALSE(PredictMaxBatch(profiles, options).ok());
}

}  // namespace
}  // namespace mutwo::planner
