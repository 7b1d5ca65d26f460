#include "server/profile_limits.h"

#include "absl/strings/str_cat.h"
#include "common/parse.h"

namespace mutwo {

int64_t ProfileEdges(const v1::Profile& profile) {
  int64_t edges = 0;
  for (const v1::ProfileNode& node : profile.nodes()) {
    edges += node.input_nodes_size();
  }
  for (const v1::Activation& a : profile.activations()) {
    edges += a.recompute_sources_size() + a.recompute_nodes_size();
  }
  return edges;
}

int64_t PlanningWorkingBytes(const v1::Profile& profile) {
  return kPlannerBytesPerElement *
         (profile.nodes_size() + profile.backward_steps_size() +
          profile.activations_size() + ProfileEdges(profile));
}

absl::Status CheckProfileSize(const v1::Profile& profile,
                              const ProfileLimits& limits, std::string* limit) {
  auto refuse = [&](const char* name, const std::string& what) {
    if (limit != nullptr) *limit = name;
    return absl::ResourceExhaustedError(
        absl::StrCat("profile of batch size ", profile.batch_size(), " has ",
                     what, "; this server plans profiles up to --", name,
                     "; raise it to take "
                     "this model"));
  };
  if (profile.nodes_size() > limits.max_nodes) {
    return refuse("max_profile_nodes",
                  absl::StrCat(profile.nodes_size(), " nodes, more than ",
                               limits.max_nodes));
  }
  if (profile.backward_steps_size() > limits.max_nodes) {
    return refuse(
        "max_profile_nodes",
        absl::StrCat(profile.backward_steps_size(),
                     " backward steps, more than ", limits.max_nodes));
  }
  if (const int64_t edges = ProfileEdges(profile); edges > limits.max_edges) {
    return refuse("max_profile_edges",
                  absl::StrCat(edges,
                               " edges (data edges and recompute "
                               "lineages), more than ",
                               limits.max_edges));
  }
  if (const int64_t bytes = PlanningWorkingBytes(profile);
      bytes > limits.max_report_plan_bytes) {
    if (limit != nullptr) *limit = "max_report_plan_bytes";
    return absl::ResourceExhaustedError(absl::StrCat(
        "profile of batch size ", profile.batch_size(), " needs about ",
        FormatBytes(bytes), " to plan (", kPlannerBytesPerElement,
        " B per node, backward step, activation and "
        "edge), more than the ",
        FormatBytes(limits.max_report_plan_bytes),
        " a report's planning may hold (--max_report_plan_bytes); raise it to "
        "take this model"));
  }
  return absl::OkStatus();
}

}  // namespace mutwo
