#include "planner/mutwo_policy.h"

#include <gtest/gtest.h>

#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "planner/baselines.h"
#include "planner/interrupt.h"
#include "tests/planner/test_profiles.h"

namespace mutwo::planner {
namespace {

using testing::MakeProfile;

// a0 (1000 bytes) is inactive from node 0 to the last backward step; the
// peak (1300) is during node 3 and step 4. Recomputing a0 costs 100 ms.
PlanProfile SwapOrRecompute(double backward_step_ms) {
  PlanProfile p = MakeProfile(4, 4, 0,
                              {{0, 1000, 0, 7, 7, {}},
                               {1, 100, 2, 6, 6, {}},
                               {2, 100, 3, 5, 5, {}},
                               {3, 100, 3, 4, 4, {}}});
  for (auto& n : p.nodes) n.forward_ms = 1000;
  for (auto& s : p.backward_steps) s.ms = backward_step_ms;
  for (auto& a : p.activations) a.recompute_ms = 100;
  p.activations[0].inactive_ms = 6000;
  p.host_to_device_bytes_per_second = 2000;  // 500 ms per transfer
  p.device_to_host_bytes_per_second = 2000;
  return p;
}

struct Outcome {
  Decisions decisions;
  SimResult sim;
  std::vector<TrajectoryStep> steps;
};

Outcome RunPolicy(const PlanProfile& p, int64_t budget) {
  auto sim = Simulator::Create(&p);
  EXPECT_TRUE(sim.ok());
  auto policy = MutwoPolicy::Create(sim->get(), {});
  EXPECT_TRUE(policy.ok());
  Outcome o;
  o.decisions = (*policy)->Run(budget, &o.steps);
  o.sim = (*sim)->Run(o.decisions);
  return o;
}

TEST(MutwoPolicyTest, SwapsWhenBackwardComputeHidesTheTransfer) {
  const PlanProfile p = SwapOrRecompute(/*backward_step_ms=*/1000);
  Outcome o = RunPolicy(p, 1250);
  ASSERT_EQ(o.steps.size(), 1u);
  EXPECT_EQ(o.decisions[0].action, Action::kSwap);
  EXPECT_EQ(o.decisions[0].prefetch_at, 6);  // one step ahead of its use
  EXPECT_DOUBLE_EQ(o.sim.stall_ms, 0);
  EXPECT_LE(o.sim.peak_bytes, 1250);
  EXPECT_DOUBLE_EQ(o.sim.recompute_ms, 0);
}

// An activation a swap cannot move (held by tensors inside the op, not by
// its outputs) is recomputed even where a swap would be free.
TEST(MutwoPolicyTest, NeverSwapsAnUnswappableActivation) {
  PlanProfile p = SwapOrRecompute(/*backward_step_ms=*/1000);
  p.activations[0].swappable = false;
  Outcome o = RunPolicy(p, 1250);
  EXPECT_EQ(o.decisions[0].action, Action::kRecompute);
  for (const Decision& d : o.decisions) EXPECT_NE(d.action, Action::kSwap);
  EXPECT_LE(o.sim.peak_bytes, 1250);
}

TEST(MutwoPolicyTest, RecomputesWhenTheTransferWouldStall) {
  const PlanProfile p = SwapOrRecompute(/*backward_step_ms=*/1);
  Outcome o = RunPolicy(p, 1250);
  ASSERT_EQ(o.steps.size(), 1u);
  EXPECT_EQ(o.decisions[0].action, Action::kRecompute);
  EXPECT_LE(o.sim.peak_bytes, 1250);
  EXPECT_DOUBLE_EQ(o.sim.stall_ms, 0);
  EXPECT_DOUBLE_EQ(o.sim.recompute_ms, 1000);  // node 0's forward time
}

TEST(MutwoPolicyTest, NoSwapWithoutBandwidth) {
  PlanProfile p = SwapOrRecompute(1000);
  p.host_to_device_bytes_per_second = 0;
  p.device_to_host_bytes_per_second = 0;
  Outcome o = RunPolicy(p, 1250);
  for (const Decision& d : o.decisions) EXPECT_NE(d.action, Action::kSwap);
  EXPECT_LE(o.sim.peak_bytes, 1250);
}

TEST(MutwoPolicyTest, OnlyChoosesActivationsInactiveAtThePeak) {
  // Each step's activation is inactive at the peak position of the plan
  // before it (last forward use < peak < first backward use): the
  // trajectory is replayed on the simulator, choice by choice (and the
  // refinement's returns to RETAIN), to find that position. Every step
  // also lowers memory where the peak was: the peak never rises.
  std::mt19937 rng(7);
  int checked = 0;
  for (int g = 0; g < 50; ++g) {
    const PlanProfile p = testing::RandomProfile(rng, 12);
    Outcome o = RunPolicy(p, 0);
    auto sim = Simulator::Create(&p);
    ASSERT_TRUE(sim.ok()) << sim.status();
    Decisions decisions(p.activations.size());
    int64_t previous = (*sim)->baseline_peak_bytes();
    for (size_t k = 0; k < o.steps.size(); ++k) {
      const TrajectoryStep& step = o.steps[k];
      const int peak_position = (*sim)->Run(decisions).peak_position;
      const PlanActivation& a = p.activations[step.activation];
      EXPECT_LT(a.last_forward_use, peak_position)
          << "profile " << g << " step " << k << ": activation "
          << step.activation << " is still in forward use at the peak";
      EXPECT_LT(peak_position, a.first_backward_use)
          << "profile " << g << " step " << k << ": activation "
          << step.activation << " is in backward use at the peak";
      ++checked;
      decisions[step.activation] = {step.action, step.prefetch_at};
      for (int r : step.retained_again) decisions[r] = Decision{};
      // The replay is the trajectory the policy simulated.
      ASSERT_EQ((*sim)->Run(decisions).peak_bytes, step.peak_bytes)
          << "profile " << g << " step " << k;
      EXPECT_LE(step.peak_bytes, previous);
      previous = step.peak_bytes;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(MutwoPolicyTest, StopsAsSoonAsTheBudgetFits) {
  std::mt19937 rng(11);
  const PlanProfile p = testing::RandomProfile(rng, 16);
  Outcome all = RunPolicy(p, 0);
  ASSERT_GE(all.steps.size(), 2u);
  const int64_t budget = all.steps[0].peak_bytes;
  Outcome one = RunPolicy(p, budget);
  EXPECT_EQ(one.steps.size(), 1u);
  EXPECT_EQ(one.sim.peak_bytes, budget);
}

// The incremental rounds (the large-graph policy) make exactly the choices
// of the full re-simulation and full candidate scan, step by step, down to
// the floor, with the same estimated overheads, peaks and times.
TEST(MutwoPolicyTest, IncrementalRoundsMakeTheSameChoicesAsFullSimulation) {
  std::mt19937 rng(99);
  int incremental_steps = 0;
  for (int g = 0; g < 40; ++g) {
    const PlanProfile p = testing::RichRandomProfile(rng, 30 + 7 * g);
    auto sim = Simulator::Create(&p);
    ASSERT_TRUE(sim.ok()) << sim.status();
    MutwoPolicy::Options options;
    options.refine = false;
    options.time_each_step = false;
    options.allow_swap = g % 4 != 3;
    options.order = g % 3 == 2 ? MutwoPolicy::Options::Order::kCheapest
                               : MutwoPolicy::Options::Order::kRatio;
    auto fast = MutwoPolicy::Create(sim->get(), options);
    options.incremental = false;
    auto full = MutwoPolicy::Create(sim->get(), options);
    ASSERT_TRUE(fast.ok() && full.ok());
    ASSERT_TRUE((*fast)->incremental());
    ASSERT_FALSE((*full)->incremental());
    std::vector<TrajectoryStep> a, b;
    const Decisions da = (*fast)->Run(0, &a);
    const Decisions db = (*full)->Run(0, &b);
    ASSERT_EQ(a.size(), b.size()) << "graph " << g;
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE("graph " + std::to_string(g) + " step " + std::to_string(i));
      EXPECT_EQ(a[i].activation, b[i].activation);
      EXPECT_EQ(a[i].action, b[i].action);
      EXPECT_EQ(a[i].prefetch_at, b[i].prefetch_at);
      EXPECT_EQ(a[i].estimated_overhead_ms, b[i].estimated_overhead_ms);
      EXPECT_EQ(a[i].peak_bytes, b[i].peak_bytes);
      EXPECT_EQ(a[i].iteration_ms, b[i].iteration_ms);
    }
    for (size_t c = 0; c < da.size(); ++c) {
      EXPECT_EQ(da[c].action, db[c].action);
      EXPECT_EQ(da[c].prefetch_at, db[c].prefetch_at);
    }
    EXPECT_EQ((*fast)->peak_bytes(), (*full)->peak_bytes());
    incremental_steps += static_cast<int>(a.size());
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(incremental_steps, 1000);  // the trajectories are not trivial
}

// Building the round state of a large graph (the large-graph policy from a
// seed, as the Planner's seeded trajectory) takes about a second; a
// cancelled request or a server drain must not wait for it. The cancellation
// arrives a few polls into the build, so the polls inside its loops are what
// stops it, not only a check on entry.
TEST(MutwoPolicyTest, CreateStopsPromptlyWhenInterrupted) {
  const PlanProfile p = testing::DeepResidualProfile(1640);  // 16,400 nodes
  auto sim = Simulator::Create(&p);
  ASSERT_TRUE(sim.ok());
  MutwoPolicy::Options options;
  options.refine = false;
  options.time_each_step = false;
  options.seed = SqrtNCheckpointing(p);

  absl::Time start = absl::Now();
  auto whole = MutwoPolicy::Create(sim->get(), options);
  const absl::Duration whole_time = absl::Now() - start;
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE((*whole)->incremental());

  int polls = 0;
  Interrupt cancelled(absl::InfiniteFuture(), [&] { return ++polls > 3; });
  options.interrupt = &cancelled;
  start = absl::Now();
  auto stopped = MutwoPolicy::Create(sim->get(), options);
  const absl::Duration stopped_time = absl::Now() - start;
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled)
      << stopped.status();
  EXPECT_EQ(polls, 4);
  EXPECT_LT(stopped_time, whole_time / 2)
      << "whole build " << whole_time << ", interrupted " << stopped_time;
  std::cout << "{\"test\":\"policy_create_interrupt\",\"whole_ms\":"
            << absl::ToDoubleMilliseconds(whole_time) << ",\"interrupted_ms\":"
            << absl::ToDoubleMilliseconds(stopped_time) << "}\n";

  // An expired deadline: its own error, before any of the work.
  Interrupt expired(absl::Now() - absl::Seconds(1), nullptr);
  options.interrupt = &expired;
  auto late = MutwoPolicy::Create(sim->get(), options);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace mutwo::planner
