// A valid profile crafted to make the planner work hard: a chain
// of `activations` ops where every activation is recomputed from the
// `fan_in` activations before it and is consumed by the `fan_in` ops after
// it, so recompute lineages are dense and long. Everything passes
// planner::ValidateProfile; only its cost is hostile (unbounded, a 4k
// profile took 81.8 s to plan).
#ifndef MUTWO_TESTS_TESTING_ADVERSARIAL_PROFILE_H_
#define MUTWO_TESTS_TESTING_ADVERSARIAL_PROFILE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "mutwo/v1/types.pb.h"

namespace mutwo::testing {

inline v1::Profile DenseRecomputeProfile(int activations, int fan_in,
                                         int64_t batch_size = 8) {
  const int n = activations;
  constexpr int64_t kSize = int64_t{1} << 20;
  constexpr double kMs = 0.1;
  v1::Profile p;
  p.set_batch_size(batch_size);
  p.set_graph_fingerprint("dense-recompute");
  p.mutable_device()->set_kind("cpu");
  p.mutable_device()->set_name("cpu");
  p.mutable_device()->set_total_bytes(int64_t{64} << 30);
  // Backward step k differentiates node n - 1 - k: position n + k.
  auto grad_pos = [n](int node) { return n + (n - 1 - node); };
  std::vector<double> end(2 * n);
  double t = 0;
  for (int i = 0; i < 2 * n; ++i) {
    t += i < n ? kMs : 2 * kMs;
    end[i] = t;
  }
  int64_t live = 0;
  for (int i = 0; i < n; ++i) {
    live += kSize;
    v1::ProfileNode* node = p.add_nodes();
    node->set_id(i);
    node->set_kind("aten::mul");
    node->set_is_op(true);
    node->set_forward_ms(kMs);
    node->set_allocated_bytes_after(live);
    node->set_peak_bytes_during(live);
  }
  for (int k = 0; k < n; ++k) {
    live -= kSize;
    v1::BackwardStep* step = p.add_backward_steps();
    step->set_forward_node(n - 1 - k);
    step->set_ms(2 * kMs);
    step->set_allocated_bytes_after(live);
    step->set_peak_bytes_during(live + kSize);
  }
  for (int j = 0; j < n; ++j) {
    v1::Activation* a = p.add_activations();
    a->set_value_id(j);
    a->set_producer_node(j);
    a->set_size_bytes(kSize);
    const int last_consumer = std::min(n - 1, j + fan_in);
    a->set_last_forward_use(last_consumer);
    a->set_first_backward_use(grad_pos(last_consumer));
    a->set_last_backward_use(grad_pos(j));
    for (int s = std::max(0, j - fan_in); s < j; ++s)
      a->add_recompute_sources(s);
    a->add_recompute_nodes(j);
    a->set_recompute_ms(kMs);
    a->set_inactive_ms(end[a->first_backward_use() - 1] -
                       end[a->last_forward_use()]);
  }
  p.mutable_measured()->set_peak_bytes(int64_t{n} * kSize);
  p.mutable_measured()->set_iteration_ms(t);
  return p;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_ADVERSARIAL_PROFILE_H_
