// A small v1::Profile (the diamond of test_profiles.h) for the proto and CLI
// tests.
#ifndef MUTWO_TESTS_PLANNER_PROTO_PROFILE_H_
#define MUTWO_TESTS_PLANNER_PROTO_PROFILE_H_

#include "mutwo/v1/types.pb.h"
#include "tests/planner/test_profiles.h"

namespace mutwo::planner::testing {

// `p` as the worker reports it (CPU device of `device_total_bytes`). Value
// ids are 100 + index, so that ids and indices differ.
inline v1::Profile ProfileProto(const PlanProfile& p,
                                int64_t device_total_bytes) {
  v1::Profile out;
  out.mutable_device()->set_kind("cpu");
  out.mutable_device()->set_total_bytes(device_total_bytes);
  out.mutable_fixed()->set_parameter_bytes(p.fixed_bytes);
  if (p.measured_iteration_ms > 0) {
    out.mutable_measured()->set_iteration_ms(p.measured_iteration_ms);
  }
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    v1::ProfileNode* n = out.add_nodes();
    n->set_id(static_cast<int>(i));
    n->set_kind("aten::linear");
    n->set_scope("block" + std::to_string(i));
    n->set_forward_ms(p.nodes[i].forward_ms);
    n->set_is_op(true);
  }
  for (size_t k = 0; k < p.backward_steps.size(); ++k) {
    v1::BackwardStep* s = out.add_backward_steps();
    s->set_index(static_cast<int>(k));
    s->set_forward_node(static_cast<int>(p.nodes.size() - 1 - k));
    s->set_ms(p.backward_steps[k].ms);
  }
  for (const PlanActivation& a : p.activations) {
    v1::Activation* o = out.add_activations();
    o->set_value_id(100 + a.value_id);
    o->set_producer_node(a.producer_node);
    o->set_size_bytes(a.size_bytes);
    o->set_last_forward_use(a.last_forward_use);
    o->set_first_backward_use(a.first_backward_use);
    o->set_last_backward_use(a.last_backward_use);
    o->set_inactive_ms(a.inactive_ms);
    o->set_recompute_ms(a.recompute_ms);
    for (int s : a.recompute_sources) o->add_recompute_sources(100 + s);
    for (int n : a.recompute_nodes) o->add_recompute_nodes(n);
  }
  return out;
}

inline v1::Profile DiamondProto() {
  v1::Profile out = ProfileProto(Diamond(), /*device_total_bytes=*/4000);
  out.set_graph_fingerprint("fp-diamond");
  out.set_model_sha256("abc123");
  out.set_batch_size(8);
  return out;
}

}  // namespace mutwo::planner::testing

#endif  // MUTWO_TESTS_PLANNER_PROTO_PROFILE_H_
