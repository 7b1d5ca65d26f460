#include "planner/replay_closure.h"

#include <gtest/gtest.h>

#include "tests/planner/test_profiles.h"

namespace mutwo::planner {
namespace {

using testing::MakeProfile;

// conv -> batch_norm -> silu_ -> conv -> head, EfficientNet's pattern: the
// in-place SiLU saves a clone of BatchNorm's output (S), and BatchNorm's
// output B is overwritten by the SiLU and read by the second conv. Backward
// step k differentiates node 4 - k (positions 5..9).
PlanProfile BatchNormSilu(int b_last_forward_use) {
  PlanProfile p = MakeProfile(5, 5, 1000,
                              {{0, 100, 1, 8, 8, {}},
                               {1, 100, b_last_forward_use, 6, 8, {0}},
                               {2, 100, 2, 7, 7, {0}},
                               {3, 100, 4, 5, 6, {1}},
                               {4, 10, 4, 5, 5, {3}}});
  p.activations[2].recompute_nodes = {1, 2};  // the clone needs the BN again
  return p;
}

// CloseOverReplays(p, d) with d's own simulation.
Decisions Closed(const PlanProfile& p, const Decisions& d) {
  auto sim = Simulator::Create(&p);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return d;
  return CloseOverReplays(p, d, (*sim)->Run(d));
}

Decisions RecomputeCloneAndConv() {
  Decisions d(5);
  d[2].action = Action::kRecompute;
  d[3].action = Action::kRecompute;
  return d;
}

TEST(ReplayClosureTest, ARetainedOutputOfAReplayedNodeIsRecomputed) {
  const PlanProfile p = BatchNormSilu(3);
  auto sim = Simulator::Create(&p);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const Decisions d = RecomputeCloneAndConv();
  const SimResult before = (*sim)->Run(d);
  ASSERT_EQ(before.segments, 1);
  const Decisions closed = CloseOverReplays(p, d, before);
  EXPECT_EQ(closed[1].action, Action::kRecompute);
  for (int a : {0, 2, 3, 4}) EXPECT_EQ(closed[a], d[a]) << a;
  // B is no longer resident between forward and backward: at node 4 only
  // X (its source, held for the replay), C and the head are; the peak, at
  // the replay, holds all of them either way.
  const SimResult after = (*sim)->Run(closed);
  EXPECT_EQ(after.segments, 1);
  EXPECT_EQ(after.segment_of[1], after.segment_of[2]);
  EXPECT_EQ(before.planned_peak_bytes[4], 1000 + 100 + 100 + 100 + 10);
  EXPECT_EQ(after.planned_peak_bytes[4], 1000 + 100 + 100 + 10);
  EXPECT_EQ(after.peak_bytes, before.peak_bytes);
  // No replay work is added: node 1 was replayed already.
  EXPECT_DOUBLE_EQ(after.recompute_ms, before.recompute_ms);
}

TEST(ReplayClosureTest, WhatTheRangeRunsAgainCountsEvenIfNotRecomputable) {
  // The profiler would not let a policy recompute B (Swin's softmax behind
  // the attention-mask `if`), and its lineage starts before the range; the
  // range runs it again all the same, from X, which the segment holds.
  PlanProfile p = BatchNormSilu(3);
  p.activations[1].recomputable = false;
  p.activations[1].recompute_nodes = {0, 1};
  const Decisions d = RecomputeCloneAndConv();
  const Decisions closed = Closed(p, d);
  EXPECT_EQ(closed[1].action, Action::kRecompute);
}

TEST(ReplayClosureTest, AnOutputRebuiltFromWhatNoSegmentHoldsStaysRetained) {
  // B read from the head's output instead: nothing the segment holds.
  PlanProfile p = BatchNormSilu(3);
  p.activations[1].recompute_sources = {4};
  const Decisions d = RecomputeCloneAndConv();
  const Decisions closed = Closed(p, d);
  EXPECT_EQ(closed[1].action, Action::kRetain);
}

TEST(ReplayClosureTest, AnOutputReadAfterTheSegmentStaysRetained) {
  // B is read by the head (node 4), after the segment's last member: the
  // executor keeps it as a segment output.
  const PlanProfile p = BatchNormSilu(4);
  const Decisions d = RecomputeCloneAndConv();
  const Decisions closed = Closed(p, d);
  EXPECT_EQ(closed[1].action, Action::kRetain);
}

TEST(ReplayClosureTest, OutputsOfNodesNoSegmentReplaysStayRetained) {
  const PlanProfile p = BatchNormSilu(3);
  Decisions d(5);
  d[3].action = Action::kRecompute;  // the conv alone: node 1 not replayed
  const Decisions closed = Closed(p, d);
  EXPECT_EQ(closed, d);
}

}  // namespace
}  // namespace mutwo::planner
