#include "worker/profile_format.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"

namespace mutwo::worker {
namespace {

// Quotes a CSV cell when it needs it.
std::string Cell(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

template <typename Repeated>
std::string Joined(const Repeated& values) {
  return absl::StrJoin(values.begin(), values.end(), ";");
}

}  // namespace

std::string FormatProfileCsv(const v1::Profile& profile) {
  std::string out =
      "id,kind,scope,forward_ms,backward_ms,allocated_bytes_after,"
      "peak_bytes_during,is_op,input_nodes\n";
  for (const v1::ProfileNode& n : profile.nodes()) {
    absl::StrAppend(&out, n.id(), ",", Cell(n.kind()), ",", Cell(n.scope()),
                    ",", absl::StrFormat("%.6f", n.forward_ms()), ",",
                    absl::StrFormat("%.6f", n.backward_ms()), ",",
                    n.allocated_bytes_after(), ",", n.peak_bytes_during(), ",",
                    n.is_op() ? "true" : "false", ",", Joined(n.input_nodes()),
                    "\n");
  }
  absl::StrAppend(
      &out,
      "\nvalue_id,producer_node,size_bytes,storages,"
      "last_forward_use,first_backward_use,last_backward_use,inactive_ms,"
      "recompute_ms,swap_ms,recompute_sources,recompute_nodes\n");
  for (const v1::Activation& a : profile.activations()) {
    absl::StrAppend(
        &out, a.value_id(), ",", a.producer_node(), ",", a.size_bytes(), ",",
        a.storages(), ",", a.last_forward_use(), ",", a.first_backward_use(),
        ",", a.last_backward_use(), ",",
        absl::StrFormat("%.6f", a.inactive_ms()), ",",
        absl::StrFormat("%.6f", a.recompute_ms()), ",",
        absl::StrFormat("%.6f", a.swap_ms()), ",",
        Joined(a.recompute_sources()), ",", Joined(a.recompute_nodes()), "\n");
  }
  return out;
}

std::string FormatProfileText(const v1::Profile& profile) {
  const v1::MeasuredStep& m = profile.measured();
  const v1::FixedMemory& f = profile.fixed();
  std::string out;
  absl::StrAppend(&out, "graph ", profile.graph_fingerprint(), ": ",
                  profile.nodes_size(), " nodes, ",
                  profile.backward_steps_size(), " backward steps, batch ",
                  profile.batch_size(), "\n");
  absl::StrAppend(&out, "device ", profile.device().name(), " (",
                  profile.device().kind(), ", ",
                  FormatBytes(profile.device().total_bytes()), ", libtorch ",
                  profile.device().libtorch_version(), ")\n");
  if (profile.oom()) {
    absl::StrAppend(&out, "OUT OF MEMORY at ", profile.oom_step(), "\n");
    return out;
  }
  absl::StrAppend(&out, "fixed: parameters ", FormatBytes(f.parameter_bytes()),
                  ", buffers ", FormatBytes(f.buffer_bytes()), ", gradients ",
                  FormatBytes(f.gradient_bytes()), ", optimizer state ",
                  FormatBytes(f.optimizer_state_bytes()), ", inputs ",
                  FormatBytes(f.input_bytes()), "\n");
  absl::StrAppend(&out, "step: ", absl::StrFormat("%.2f", m.iteration_ms()),
                  " ms (forward ", absl::StrFormat("%.2f", m.forward_ms()),
                  ", backward ", absl::StrFormat("%.2f", m.backward_ms()),
                  ", optimizer ", absl::StrFormat("%.2f", m.optimizer_ms()),
                  "); plain module step ",
                  absl::StrFormat("%.2f", m.module_iteration_ms()), " ms\n");
  absl::StrAppend(&out, "peak ", FormatBytes(m.peak_bytes()),
                  " (plain module step ", FormatBytes(m.module_peak_bytes()),
                  "); end of forward ", FormatBytes(m.end_of_forward_bytes()),
                  "; activations ", profile.activations_size(), " = ",
                  FormatBytes(m.tracked_activation_bytes()), "\n");
  absl::StrAppend(&out, "interpreter vs module: loss ",
                  profile.loss_matches_module() ? "matches" : "DIFFERS",
                  ", max |grad diff| ",
                  absl::StrFormat("%g", profile.max_abs_grad_diff()), "\n");
  std::vector<const v1::Activation*> largest;
  for (const v1::Activation& a : profile.activations()) largest.push_back(&a);
  std::sort(largest.begin(), largest.end(),
            [](const v1::Activation* a, const v1::Activation* b) {
              return a->size_bytes() > b->size_bytes();
            });
  if (largest.size() > 10) largest.resize(10);
  if (!largest.empty()) absl::StrAppend(&out, "largest activations:\n");
  for (const v1::Activation* a : largest) {
    const v1::ProfileNode& node = profile.nodes(a->producer_node());
    absl::StrAppend(
        &out, "  ", FormatBytes(a->size_bytes()), "  node ", node.id(), " ",
        node.kind(), node.scope().empty() ? "" : " " + node.scope(),
        "  inactive ", absl::StrFormat("%.2f", a->inactive_ms()),
        " ms, recompute ", absl::StrFormat("%.2f", a->recompute_ms()), " ms\n");
  }
  return out;
}

}  // namespace mutwo::worker
