#include "planner/proto_convert.h"

#include <gtest/gtest.h>

#include <limits>

#include "common/parse.h"
#include "common/proto_io.h"
#include "common/version.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/plan_request.h"
#include "tests/planner/proto_profile.h"

namespace mutwo::planner {
namespace {

using testing::DiamondProto;

TEST(ProtoConvertTest, ProfileFieldsAndIdsSurvive) {
  const v1::Profile proto = DiamondProto();
  auto p = ProfileFromProto(proto);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->activations.size(), 5u);
  EXPECT_EQ(p->activations[3].value_id, 103);
  // Sources are translated from value ids to indices.
  EXPECT_EQ(p->activations[3].recompute_sources, (std::vector<int>{1, 2}));
  EXPECT_EQ(p->activations[4].last_backward_use, 5);
  EXPECT_EQ(p->nodes[2].scope, "block2");
  EXPECT_EQ(p->device_total_bytes, 4000);
  EXPECT_FALSE(p->CanSwap());
  EXPECT_TRUE(p->activations[3].swappable);
}

// Swappable: at most 1% of the activation outside the producer's outputs.
TEST(ProtoConvertTest, UnswappableBytesMakeAnActivationUnswappable) {
  v1::Profile proto = DiamondProto();
  ASSERT_EQ(proto.activations(4).size_bytes(), 400);
  proto.mutable_activations(4)->set_unswappable_bytes(4);  // 1%
  proto.mutable_activations(2)->set_unswappable_bytes(
      proto.activations(2).size_bytes() / 2);
  auto p = ProfileFromProto(proto);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->activations[4].swappable);
  EXPECT_FALSE(p->activations[2].swappable);
  proto.mutable_activations(4)->set_unswappable_bytes(401);
  auto bad = ProfileFromProto(proto);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unswappable_bytes"), std::string::npos)
      << bad.status();
}

// Node times come from the interpreted step synchronised after every node;
// the plain module step is faster, and the executor's steps match it.
TEST(ProtoConvertTest, ComputeTimesAreScaledToTheModuleStep) {
  v1::Profile proto = DiamondProto();
  proto.mutable_device()->set_host_to_device_bytes_per_second(1e6);
  proto.mutable_device()->set_device_to_host_bytes_per_second(1e6);
  proto.mutable_activations(1)->set_inactive_ms(4);
  proto.mutable_activations(1)->set_swap_ms(0.4);
  v1::MeasuredStep* m = proto.mutable_measured();
  m->set_iteration_ms(20);
  m->set_optimizer_ms(2);
  m->set_optimizer_peak_bytes(10);
  const PlanProfile unscaled = *ProfileFromProto(proto);
  EXPECT_EQ(unscaled.measured_iteration_ms, 20);  // no module step measured
  EXPECT_EQ(unscaled.nodes[0].forward_ms, 1);

  m->set_module_iteration_ms(15);
  auto p = ProfileFromProto(proto);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->measured_iteration_ms, 15);
  for (size_t i = 0; i < p->nodes.size(); ++i) {
    EXPECT_DOUBLE_EQ(p->nodes[i].forward_ms,
                     0.75 * unscaled.nodes[i].forward_ms);
  }
  for (size_t k = 0; k < p->backward_steps.size(); ++k) {
    EXPECT_DOUBLE_EQ(p->backward_steps[k].ms,
                     0.75 * unscaled.backward_steps[k].ms);
  }
  EXPECT_DOUBLE_EQ(p->backward_steps.back().ms, 1.5);  // the optimizer step
  EXPECT_DOUBLE_EQ(p->activations[1].recompute_ms, 0.75);
  EXPECT_DOUBLE_EQ(p->activations[1].inactive_ms, 3);
  // Transfers are bandwidth-bound: not scaled.
  EXPECT_DOUBLE_EQ(p->activations[1].swap_ms, 0.4);
  EXPECT_EQ(p->host_to_device_bytes_per_second, 1e6);

  // The no-checkpointing schedule predicts the module step; a recompute
  // costs the scaled replay time.
  ScheduleRequest request;
  request.budget.set_fraction_of_baseline(1.0);
  request.policy = v1::NONE;
  auto none = PlanSchedule(proto, request);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_DOUBLE_EQ(none->predicted_iteration_ms(), 15);
  EXPECT_DOUBLE_EQ(none->baseline_iteration_ms(), 15);
  request.policy = v1::SQRT_N;
  auto sqrt_n = PlanSchedule(proto, request);
  ASSERT_TRUE(sqrt_n.ok()) << sqrt_n.status();
  EXPECT_DOUBLE_EQ(sqrt_n->predicted_iteration_ms(),
                   15 + sqrt_n->predicted_recompute_ms());
  EXPECT_DOUBLE_EQ(sqrt_n->predicted_recompute_ms(),
                   0.75 * sqrt_n->recomputed());  // 1 ms nodes, one each

  // A module step slower than the interpreted one (TorchScript still
  // compiling) is not a step the executor runs: no scaling up.
  m->set_module_iteration_ms(160);
  auto slower = ProfileFromProto(proto);
  ASSERT_TRUE(slower.ok()) << slower.status();
  EXPECT_EQ(slower->measured_iteration_ms, 20);
  EXPECT_EQ(slower->nodes[0].forward_ms, 1);
  EXPECT_EQ(TimeScale(*m), 1);

  m->set_module_iteration_ms(-1);
  auto bad = ProfileFromProto(proto);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("measured.module_iteration_ms"),
            std::string::npos)
      << bad.status();
}

// Host times are what the host pays: carried over and never scaled; bad
// values are refused naming the field.
TEST(ProtoConvertTest, HostTimesAndReplayOverheadAreNotScaled) {
  v1::Profile proto = DiamondProto();
  proto.mutable_nodes(2)->set_host_ms(0.3);
  v1::MeasuredStep* m = proto.mutable_measured();
  m->set_iteration_ms(20);
  m->set_module_iteration_ms(10);
  m->set_replay_overhead_ms(0.07);
  auto p = ProfileFromProto(proto);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->nodes[2].host_ms, 0.3);
  EXPECT_DOUBLE_EQ(p->nodes[0].host_ms, 0);
  EXPECT_DOUBLE_EQ(p->replay_overhead_ms, 0.07);

  proto.mutable_nodes(2)->set_host_ms(-1);
  auto bad_node = ProfileFromProto(proto);
  ASSERT_FALSE(bad_node.ok());
  EXPECT_NE(bad_node.status().message().find("nodes[2].host_ms"),
            std::string::npos)
      << bad_node.status();
  proto.mutable_nodes(2)->set_host_ms(0.3);
  m->set_replay_overhead_ms(std::numeric_limits<double>::infinity());
  auto bad_overhead = ProfileFromProto(proto);
  ASSERT_FALSE(bad_overhead.ok());
  EXPECT_NE(bad_overhead.status().message().find("measured.replay_overhead_ms"),
            std::string::npos)
      << bad_overhead.status();
}

TEST(ProtoConvertTest, ScheduleRoundTrip) {
  const v1::Profile proto = DiamondProto();
  ScheduleRequest request;
  request.device_reserve = false;  // a 1 KB graph: 16 KiB would leave nothing
  request.budget = *ParseBudget("70%");
  request.pareto_points = 20;
  auto s = PlanSchedule(proto, request);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->feasible());
  EXPECT_EQ(s->planner_version(), kPlannerVersion);
  EXPECT_EQ(s->graph_fingerprint(), "fp-diamond");
  EXPECT_EQ(s->model_sha256(), "abc123");
  EXPECT_EQ(s->batch_size(), 8);
  EXPECT_EQ(s->policy(), v1::MUTWO);
  EXPECT_EQ(s->baseline_peak_bytes(), 1050);
  EXPECT_EQ(s->budget_bytes(), 735);
  EXPECT_LE(s->predicted_peak_bytes(), 735);
  EXPECT_EQ(s->decisions_size(), 5);
  EXPECT_GT(s->recomputed(), 0);
  EXPECT_GE(s->pareto_size(), 2);
  EXPECT_EQ(s->timeline_size(), 10);
  for (const v1::Decision& d : s->decisions()) {
    EXPECT_GE(d.value_id(), 100);
    if (d.action() == v1::Decision::RECOMPUTE) {
      EXPECT_FALSE(d.recompute_nodes().empty());
      EXPECT_GT(d.needed_at(), d.producer_node());
    }
  }
  // JSON (proto field names) and back: the same message.
  v1::Schedule parsed;
  ASSERT_TRUE(ProtoFromJson(ProtoToJson(*s), "schedule", &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*s, parsed));
  EXPECT_NE(ProtoToJson(*s).find("\"action\": \"RECOMPUTE\""),
            std::string::npos);
  // The decisions it encodes re-simulate to the predicted peak and time.
  auto decisions = DecisionsFromSchedule(parsed, proto);
  ASSERT_TRUE(decisions.ok());
  auto plan_profile = ProfileFromProto(proto);
  auto sim = Simulator::Create(&*plan_profile);
  SimResult r = (*sim)->Run(*decisions);
  EXPECT_EQ(r.peak_bytes, s->predicted_peak_bytes());
  EXPECT_DOUBLE_EQ(r.iteration_ms, s->predicted_iteration_ms());
}

// Issue 14: every decision names its producer's module path, op and output
// (what a user finds in the eager model), and a recompute names the module
// of every node its replay runs.
TEST(ProtoConvertTest, DecisionsNameModulePathOpAndOutput) {
  v1::Profile proto = DiamondProto();
  for (int i = 0; i < proto.nodes_size(); ++i) {
    proto.mutable_nodes(i)->set_scope(i == 0 ? ""
                                             : "stage." + std::to_string(i));
    proto.mutable_nodes(i)->set_kind(i == 2 ? "aten::relu" : "aten::linear");
  }
  proto.mutable_activations(0)->add_output_indices(0);
  proto.mutable_activations(1)->add_output_indices(1);
  proto.mutable_activations(1)->add_output_indices(2);
  ScheduleRequest request;
  request.device_reserve = false;
  request.budget = *ParseBudget("70%");
  auto s = PlanSchedule(proto, request);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->decisions_size(), proto.activations_size());
  bool saw_recompute = false;
  for (int k = 0; k < s->decisions_size(); ++k) {
    const v1::Decision& d = s->decisions(k);
    const v1::ProfileNode& node = proto.nodes(d.producer_node());
    EXPECT_EQ(d.module_path(), node.scope());
    EXPECT_EQ(d.op_kind(), node.kind());
    const int expected_output = d.value_id() == 100   ? 0
                                : d.value_id() == 101 ? 1
                                                      : -1;
    EXPECT_EQ(d.output_index(), expected_output) << d.value_id();
    if (d.action() != v1::Decision::RECOMPUTE) {
      EXPECT_TRUE(d.recompute_module_paths().empty());
      continue;
    }
    saw_recompute = true;
    // One module path per replayed node, in the same order.
    ASSERT_EQ(d.recompute_module_paths_size(), d.recompute_nodes_size());
    for (int k = 0; k < d.recompute_nodes_size(); ++k) {
      EXPECT_EQ(d.recompute_module_paths(k),
                proto.nodes(d.recompute_nodes(k)).scope());
    }
  }
  EXPECT_TRUE(saw_recompute);
}

}  // namespace
}  // namespace mutwo::planner
