#include "planner/simulator.h"

#include <gtest/gtest.h>

#include "tests/planner/test_profiles.h"

namespace mutwo::planner {
namespace {

using testing::Chain;
using testing::Diamond;
using testing::MakeProfile;
using testing::Residual;

Decisions Recompute(int n, std::initializer_list<int> which) {
  Decisions d(n);
  for (int a : which) d[a].action = Action::kRecompute;
  return d;
}

std::unique_ptr<Simulator> Sim(const PlanProfile& p) {
  auto sim = Simulator::Create(&p);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return *std::move(sim);
}

TEST(SimulatorTest, ChainBaselineAndRecompute) {
  const PlanProfile p = Chain();
  auto sim = Sim(p);
  // All three live during node 2: 1000 + 100 + 200 + 300.
  EXPECT_EQ(sim->baseline_peak_bytes(), 1600);
  SimResult none = sim->Run(Decisions(3));
  EXPECT_EQ(none.peak_bytes, 1600);
  EXPECT_EQ(none.peak_position, 2);
  EXPECT_DOUBLE_EQ(none.recompute_ms, 0);
  // A is dead between its last forward use (1) and its first backward use
  // (5): node 2 and step 3 now hold 1000 + 200 + 300.
  SimResult a = sim->Run(Recompute(3, {0}));
  EXPECT_EQ(a.peak_bytes, 1500);
  EXPECT_EQ(a.segments, 1);
  EXPECT_EQ(a.needed_at[0], 5);
  EXPECT_DOUBLE_EQ(a.recompute_ms, 1);
  EXPECT_DOUBLE_EQ(a.iteration_ms, sim->baseline_iteration_ms() + 1);
  // C's last forward use is its producer's position: nothing to free.
  EXPECT_EQ(sim->Run(Recompute(3, {2})).peak_bytes, 1600);
}

// A replay takes the device's time or the host's, whichever is longer, and
// each segment pays the replay mechanism's host cost once.
TEST(SimulatorTest, AReplayIsBoundByTheHostAndPaysItsOverheadPerSegment) {
  PlanProfile p = Diamond();  // every node 1 ms on the device
  for (PlanNode& node : p.nodes) node.host_ms = 0.25;
  p.nodes[1].host_ms = 3;
  p.nodes[2].host_ms = 3;
  p.replay_overhead_ms = 0.5;
  auto sim = Sim(p);
  // B and C: one segment, host-bound: max(1 + 1, 3 + 3) + 0.5.
  SimResult bc = sim->Run(Recompute(5, {1, 2}));
  EXPECT_EQ(bc.segments, 1);
  EXPECT_DOUBLE_EQ(bc.recompute_ms, 6.5);
  EXPECT_DOUBLE_EQ(bc.iteration_ms, sim->baseline_iteration_ms() + 6.5);
  // A and D: two segments, device-bound: (max(1, 0.25) + 0.5) each.
  SimResult ad = sim->Run(Recompute(5, {0, 3}));
  EXPECT_EQ(ad.segments, 2);
  EXPECT_DOUBLE_EQ(ad.recompute_ms, 3);
  // A profile without host times or overhead: the device's time alone.
  SimResult plain = Sim(Diamond())->Run(Recompute(5, {1, 2}));
  EXPECT_DOUBLE_EQ(plain.recompute_ms, 2);
}

TEST(SimulatorTest, DiamondHandComputedPeaks) {
  const PlanProfile p = Diamond();
  auto sim = Sim(p);
  // A + B + C + D + E during node 4.
  EXPECT_EQ(sim->baseline_peak_bytes(), 1050);
  SimResult b = sim->Run(Recompute(5, {1}));
  EXPECT_EQ(b.peak_bytes, 850);
  // B and C are consecutive: one segment replayed once before step 6. Node
  // 3 (their last forward use) and step 6 both hold A + B + C + D = 650.
  SimResult bc = sim->Run(Recompute(5, {1, 2}), Simulator::Options{true});
  EXPECT_EQ(bc.segments, 1);
  EXPECT_EQ(bc.peak_bytes, 650);
  EXPECT_EQ(bc.peak_position, 3);
  EXPECT_EQ(bc.planned_peak_bytes[4], 550);
  EXPECT_EQ(bc.planned_peak_bytes[6], 650);
  EXPECT_DOUBLE_EQ(bc.recompute_ms, 2);
  EXPECT_EQ(bc.needed_at[1], 6);
  EXPECT_EQ(bc.needed_at[2], 6);
}

TEST(SimulatorTest, ResidualHandComputedPeaks) {
  const PlanProfile p = Residual();
  auto sim = Sim(p);
  EXPECT_EQ(sim->baseline_peak_bytes(), 1050);
  EXPECT_EQ(sim->Run(Recompute(5, {1})).peak_bytes, 850);
  // x and f2 are not consecutive (f1 is retained): two segments. Node 3
  // still reads both, so the peak moves there: x + f1 + f2 + add = 1000.
  SimResult two = sim->Run(Recompute(5, {0, 2}));
  EXPECT_EQ(two.segments, 2);
  EXPECT_EQ(two.peak_bytes, 1000);
  EXPECT_EQ(two.peak_position, 3);
  // x and f1 form one segment replayed before step 7 (f1's first use): node
  // 3 holds x + f2 + add = 800.
  SimResult xf1 = sim->Run(Recompute(5, {0, 1}));
  EXPECT_EQ(xf1.segments, 1);
  EXPECT_EQ(xf1.peak_bytes, 800);
  EXPECT_EQ(xf1.needed_at[0], 7);
}

TEST(SimulatorTest, SegmentInputIsHeldUntilReplay) {
  // a0 is read by node 1 only and last needed in backward at 4, but the
  // segment {node 2} needs it as input when it is replayed before step 5.
  PlanProfile p = MakeProfile(
      3, 3, 0,
      {{0, 100, 1, 4, 4, {}}, {1, 10, 2, 4, 4, {0}}, {2, 1000, 2, 5, 5, {0}}});
  auto sim = Sim(p);
  Decisions d(3);
  d[0].action = Action::kRecompute;
  d[2].action = Action::kRecompute;
  // Node 1 (retained) splits the two segments; a0 stays resident until the
  // replay of segment {2} at 5, after its own baseline lifetime ends at 4.
  SimResult r = sim->Run(d, Simulator::Options{true});
  EXPECT_EQ(r.segments, 2);
  EXPECT_EQ(r.planned_peak_bytes[5], 1100);
  EXPECT_EQ(
      sim->Run(Decisions(3), Simulator::Options{true}).planned_peak_bytes[5],
      1000);
}

TEST(SimulatorTest, UsesMeasuredAllocatorCurve) {
  PlanProfile p = Chain();
  const int64_t after[] = {1100, 1300, 1600, 1300, 1100, 1000};
  for (int t = 0; t < 6; ++t) {
    if (t < 3) {
      p.nodes[t].allocated_bytes_after = after[t];
      p.nodes[t].peak_bytes_during = after[t] + (t == 2 ? 50 : 0);
    } else {
      p.backward_steps[t - 3].allocated_bytes_after = after[t];
    }
  }
  auto sim = Sim(p);
  // Workspace of 50 bytes during node 2 is part of the measured peak.
  EXPECT_EQ(sim->baseline_peak_bytes(), 1650);
  // Recomputing A removes 100 bytes where A is inactive (node 2, step 3).
  SimResult r = sim->Run(Recompute(3, {0}), Simulator::Options{true});
  EXPECT_EQ(r.peak_bytes, 1550);
  EXPECT_EQ(r.planned_after_bytes[2], 1500);
  EXPECT_EQ(r.planned_after_bytes[4], 1000);  // A returns before step 5
}

TEST(SimulatorTest, AReplayRunsItsOpsTransientsAgain) {
  // Node 0 (A's producer) takes a 70-byte workspace while it runs (a cuDNN
  // convolution's, say): the replay of A in backward needs it again, on
  // top of the memory there.
  const int64_t after[] = {1100, 1300, 1600, 1300, 1100, 1000};
  auto profile = [&](int64_t workspace) {
    PlanProfile p = Chain();
    for (int t = 0; t < 6; ++t) {
      if (t < 3) {
        p.nodes[t].allocated_bytes_after = after[t];
        p.nodes[t].peak_bytes_during = after[t] + (t == 0 ? workspace : 0);
        p.nodes[t].transient_bytes = t == 0 ? workspace : 0;
      } else {
        p.backward_steps[t - 3].allocated_bytes_after = after[t];
      }
    }
    return p;
  };
  const PlanProfile plain = profile(0), with_workspace = profile(70);
  auto sim_plain = Sim(plain);
  auto sim = Sim(with_workspace);
  EXPECT_EQ(sim->replay_transient_bytes(0), 70);
  EXPECT_EQ(sim->replay_transient_bytes(1), 0);
  const SimResult r0 = sim_plain->Run(Recompute(3, {0}));
  const SimResult r = sim->Run(Recompute(3, {0}));
  const int replay = r.needed_at[0];
  ASSERT_GE(replay, 3);
  for (int t = 3; t < 6; ++t) {
    EXPECT_EQ(r.planned_peak_bytes[t] - r0.planned_peak_bytes[t],
              t == replay ? 70 : 0)
        << "position " << t;
  }
}

TEST(SimulatorTest, SwapFreesAfterOffloadAndStallsWhenNotHidden) {
  // One big activation, 1000 bytes at 1000 B/s each way: 1000 ms transfers.
  PlanProfile p =
      MakeProfile(4, 4, 0, {{0, 1000, 0, 7, 7, {}}, {1, 10, 3, 4, 4, {}}});
  for (auto& n : p.nodes) n.forward_ms = 1000;
  for (auto& s : p.backward_steps) s.ms = 1000;
  p.host_to_device_bytes_per_second = 1000;
  p.device_to_host_bytes_per_second = 1000;
  auto sim = Sim(p);
  Decisions d(2);
  d[0].action = Action::kSwap;
  d[0].prefetch_at = 6;  // one 1000 ms step ahead: fully hidden
  SimResult hidden = sim->Run(d, Simulator::Options{true});
  EXPECT_EQ(hidden.offload_done_at[0], 1);
  EXPECT_EQ(hidden.planned_peak_bytes[2], 10);
  EXPECT_EQ(hidden.planned_peak_bytes[6], 1000);  // prefetched buffer
  EXPECT_DOUBLE_EQ(hidden.stall_ms, 0);
  d[0].prefetch_at = 7;  // at first use: the whole transfer stalls
  SimResult stalled = sim->Run(d);
  EXPECT_DOUBLE_EQ(stalled.stall_ms, 1000);
  EXPECT_DOUBLE_EQ(stalled.iteration_ms, sim->baseline_iteration_ms() + 1000);
}

TEST(SimulatorTest, APrefetchStartsWithTheFirstStepOfItsForwardNode) {
  // Backward steps 5 and 6 belong to forward node 2 (a convolution's
  // backward, then its weight's AccumulateGrad). The executor hooks every
  // autograd node that node made, so a prefetch planned at step 6 is
  // issued before step 5 and its buffer is resident during step 5 (on
  // ResNeXt-101 the buffer landed on the convolution's workspace peak:
  // +2.4% over the budget on an H100).
  PlanProfile p =
      MakeProfile(4, 4, 0, {{0, 1000, 0, 7, 7, {}}, {1, 10, 3, 4, 4, {}}});
  p.backward_steps[1].forward_node = 2;
  p.backward_steps[2].forward_node = 2;
  p.backward_steps[3].forward_node = 0;
  for (auto& n : p.nodes) n.forward_ms = 1000;  // the offload is done by 2
  for (auto& s : p.backward_steps) s.ms = 1000;
  p.host_to_device_bytes_per_second = 1000;
  p.device_to_host_bytes_per_second = 1000;
  EXPECT_EQ(p.IssuePosition(6), 5);
  EXPECT_EQ(p.IssuePosition(5), 5);
  EXPECT_EQ(p.IssuePosition(7), 7);
  EXPECT_EQ(p.IssuePosition(2), 2);  // forward positions stay
  auto sim = Sim(p);
  Decisions d(2);
  d[0].action = Action::kSwap;
  d[0].prefetch_at = 6;
  const SimResult r = sim->Run(d, Simulator::Options{true});
  EXPECT_EQ(r.planned_peak_bytes[5], 1000);  // the buffer, a step early
  EXPECT_LT(r.planned_peak_bytes[4], 1000);
}

TEST(SimulatorTest, RecomputeOfANonOpProducerStaysResident) {
  PlanProfile p = Chain();
  p.nodes[0].is_op = false;
  auto sim = Sim(p);
  SimResult r = sim->Run(Recompute(3, {0}));
  EXPECT_EQ(r.segments, 0);
  EXPECT_EQ(r.peak_bytes, 1600);
  EXPECT_DOUBLE_EQ(r.recompute_ms, 0);
}

TEST(SimulatorTest, RejectsInconsistentProfile) {
  PlanProfile p = Chain();
  p.activations[1].first_backward_use = 1;
  auto sim = Simulator::Create(&p);
  ASSERT_FALSE(sim.ok());
  EXPECT_NE(sim.status().message().find("first_backward_use"),
            std::string::npos);
}

}  // namespace
}  // namespace mutwo::planner
