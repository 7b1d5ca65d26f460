// The planner's proto conversions: v1::Profile -> PlanProfile (validated
// field by field), policies, PlanResult -> v1::Schedule, v1::Schedule ->
// Decisions. Planning from protos (PlanSchedule, budgets, the allocator
// reserve) is in plan_request.h. Stateless and thread-safe.
#ifndef MUTWO_PLANNER_PROTO_CONVERT_H_
#define MUTWO_PLANNER_PROTO_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"
#include "planner/max_batch.h"
#include "planner/model.h"
#include "planner/planner.h"

namespace mutwo::planner {

// Errors: InvalidArgument naming the first bad field, e.g.
// `activations[2] (value_id 7).first_backward_use = 3: must be a backward
// position in [5, 12)` (the structural checks are ValidatePlanProfile's).
[[nodiscard]] absl::StatusOr<PlanProfile> ProfileFromProto(
    const v1::Profile& profile);

// Limits on what a profile may hold, so that no profile a worker reports
// can make the planner's arithmetic overflow or its work explode: every
// byte figure at most kMaxProfileBytes (1 PiB), at most kMaxProfileNodes
// nodes and backward steps, kMaxProfileActivations activations and
// kMaxMeanRecomputeSources recompute sources per activation on average.
inline constexpr int64_t kMaxProfileBytes = int64_t{1} << 50;
inline constexpr int kMaxProfileNodes = 1 << 20;
inline constexpr int kMaxProfileActivations = 1 << 20;
// Recompute sources per activation, on average over the profile (a real op
// has a few inputs; DenseNet's widest concat a few dozen).
inline constexpr int kMaxMeanRecomputeSources = 32;

// Whether the planner can take `profile`: the checks of ProfileFromProto
// (which runs the simulator's ValidatePlanProfile), the one validation the
// server runs on a reported profile before storing it. A profile that ran
// out of memory (oom) carries no timeline and is checked for its counts and
// figures only. InvalidArgument naming the first bad field.
[[nodiscard]] absl::Status ValidateProfile(const v1::Profile& profile);

// The factor the profile's compute times are scaled by: the plain module
// step over the interpreted step synchronised after every node, when both
// are measured and the module step is the faster; else 1.
double TimeScale(const v1::MeasuredStep& measured);

// Each profile converted and paired with its batch size (errors name the
// profile's batch size).
[[nodiscard]] absl::StatusOr<std::vector<BatchProfile>> BatchProfilesFromProto(
    const std::vector<v1::Profile>& profiles);

// `mutwo`, `sqrt_n`, `per_block`, `none` (case-insensitive).
[[nodiscard]] absl::StatusOr<Policy> ParsePolicy(absl::string_view text);
Policy PolicyFromProto(v1::Policy policy);  // unspecified -> kMutwo
v1::Policy PolicyToProto(Policy policy);

// The v1::Schedule of a computed plan (decisions for every activation).
v1::Schedule ScheduleToProto(const v1::Profile& profile,
                             const PlanProfile& plan_profile,
                             const PlanResult& result,
                             const v1::MemoryBudget& budget,
                             int max_timeline_samples);

// The decisions a schedule encodes, for re-simulation. Errors:
// InvalidArgument for a value id the profile does not have.
[[nodiscard]] absl::StatusOr<Decisions> DecisionsFromSchedule(
    const v1::Schedule& schedule, const v1::Profile& profile);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_PROTO_CONVERT_H_
