// ProfileLimits: the size of profile this server plans, checked when a
// worker reports one, before anything is stored or planned. The planner's
// own limits (planner/proto_convert.h: 2^20 nodes, 32 recompute sources per
// activation on average) keep its arithmetic sound; these keep one report
// cheap: a profile's planning work grows with its nodes and its edges, and
// a report plans the knee and every budget of the job. Real profiles are
// far below the defaults (ResNet-152 at batch 64: 2,923 nodes; the CPU zoo's
// largest, EfficientNet-B0: 1,810 nodes, 3,733 edges).
//
// Edges: the IR's data edges (ProfileNode.input_nodes) plus every
// activation's recompute lineage (recompute_sources and recompute_nodes).
//
// Memory: one plan of a profile holds about PlanningWorkingBytes(profile)
// (the planner's per-node, per-activation and per-edge state; measured 125 B
// per element on dense 4,096- and 16,384-node profiles, 192 B counted), and
// a report keeps each schedule it plans until its transaction. The report's
// planning may hold max_report_plan_bytes in all: a profile whose one plan
// would need more is refused here, and a report whose schedules would pass
// it is cut (JobCore::PlanBatchResult).
//
// Errors: ResourceExhausted naming the count, the limit and its flag. Not
// InvalidArgument: the profile is well formed (another server, or this one
// with a higher limit, takes it); like --max_model_bytes and gRPC's own
// message size limit, it is larger than this server was configured to take.
#ifndef MUTWO_SERVER_PROFILE_LIMITS_H_
#define MUTWO_SERVER_PROFILE_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

struct ProfileLimits {
  // Nodes, and backward steps (--max_profile_nodes).
  int max_nodes = 8192;
  int64_t max_edges = 65536;  // --max_profile_edges
  // What one report's planning may hold: the planner's working set plus the
  // schedules kept until the report is stored (--max_report_plan_bytes).
  int64_t max_report_plan_bytes = int64_t{256} << 20;
};

// Counted per element (node, backward step, activation, edge) of a profile
// for the planner's working set.
inline constexpr int64_t kPlannerBytesPerElement = 192;

// The planner's working set for one plan of `profile`, estimated.
int64_t PlanningWorkingBytes(const v1::Profile& profile);

// The profile's edges, as counted against ProfileLimits::max_edges.
int64_t ProfileEdges(const v1::Profile& profile);

// OK when `profile` is within `limits`; else ResourceExhausted, and `*limit`
// (when not null) names the limit passed: "max_profile_nodes",
// "max_profile_edges" or "max_report_plan_bytes".
[[nodiscard]] absl::Status CheckProfileSize(const v1::Profile& profile,
                                            const ProfileLimits& limits,
                                            std::string* limit = nullptr);

}  // namespace mutwo

#endif  // MUTWO_SERVER_PROFILE_LIMITS_H_
