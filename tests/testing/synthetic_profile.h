// A hand-built v1::Profile of a chain of `nodes` ops for service tests: node
// i produces activation i (size `activation_bytes`, used by node i + 1, freed
// by its backward step), backward steps run in reverse node order, and the
// allocator figures follow from fixed memory plus the live activations.
#ifndef MUTWO_TESTS_TESTING_SYNTHETIC_PROFILE_H_
#define MUTWO_TESTS_TESTING_SYNTHETIC_PROFILE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::testing {

inline v1::Profile ChainProfile(int64_t batch_size, int nodes = 8,
                                int64_t activation_bytes = 1 << 20,
                                int64_t fixed_bytes = 4 << 20) {
  v1::Profile p;
  p.set_batch_size(batch_size);
  p.set_graph_fingerprint("chain-fingerprint");
  auto* device = p.mutable_device();
  device->set_name("cpu");
  device->set_kind("cpu");
  device->set_total_bytes(int64_t{24} << 30);
  device->set_libtorch_version("1.13.0");
  const int64_t act = activation_bytes * batch_size;
  p.mutable_fixed()->set_parameter_bytes(fixed_bytes);
  for (int i = 0; i < nodes; ++i) {
    auto* n = p.add_nodes();
    n->set_id(i);
    n->set_kind("aten::linear");
    n->set_scope(absl::StrCat("layer", i));
    n->set_forward_ms(1.0);
    n->set_backward_ms(2.0);
    n->set_allocated_bytes_after(fixed_bytes + (i + 1) * act);
    n->set_peak_bytes_during(fixed_bytes + (i + 1) * act);
    n->set_is_op(true);
    if (i > 0) n->add_input_nodes(i - 1);
  }
  for (int k = 0; k < nodes; ++k) {
    auto* s = p.add_backward_steps();
    s->set_index(k);
    s->set_name("AddmmBackward0");
    s->set_forward_node(nodes - 1 - k);
    s->set_ms(2.0);
    s->set_allocated_bytes_after(fixed_bytes + (nodes - 1 - k) * act);
    s->set_peak_bytes_during(fixed_bytes + (nodes - k) * act);
  }
  for (int i = 0; i < nodes; ++i) {
    auto* a = p.add_activations();
    a->set_value_id(i);
    a->set_producer_node(i);
    a->set_size_bytes(act);
    a->set_storages(1);
    a->set_last_forward_use(i + 1 < nodes ? i + 1 : i);
    a->set_first_backward_use(nodes + (nodes - 1 - i));
    a->set_last_backward_use(nodes + (nodes - 1 - i));
    a->set_inactive_ms(3.0 * (nodes - 1 - i));
    a->set_recompute_ms(1.0);
    if (i > 0) a->add_recompute_sources(i - 1);
    a->add_recompute_nodes(i);
  }
  auto* m = p.mutable_measured();
  m->set_peak_bytes(fixed_bytes + nodes * act);
  m->set_iteration_ms(3.0 * nodes);
  m->set_forward_ms(1.0 * nodes);
  m->set_backward_ms(2.0 * nodes);
  m->set_tracked_activation_bytes(nodes * act);
  m->set_end_of_forward_bytes(fixed_bytes + nodes * act);
  p.set_loss_matches_module(true);
  return p;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_SYNTHETIC_PROFILE_H_
