// The planner's proto edge: v1::Profile -> PlanProfile (validated field by
// field), v1::MemoryBudget -> bytes, PlanResult -> v1::Schedule, several
// profiles -> v1::MaxBatchPrediction. Used by the server and by the offline
// `mutwo plan` command. Stateless and thread-safe.
#ifndef MUTWO_PLANNER_PROTO_CONVERT_H_
#define MUTWO_PLANNER_PROTO_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"
#include "planner/interrupt.h"
#include "planner/max_batch.h"
#include "planner/model.h"
#include "planner/planner.h"

namespace mutwo::planner {

// Errors: InvalidArgument naming the first bad field, e.g.
// `activations[2] (value_id 7).first_backward_use = 3: must be after
// last_forward_use 5 and before position 12`.
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
// and of the simulator (ValidatePlanProfile), the one validation the
// server runs on a reported profile before storing it. A profile that ran
// out of memory (oom) carries no timeline and is checked for its counts and
// figures only. InvalidArgument naming the first bad field.
[[nodiscard]] absl::Status ValidateProfile(const v1::Profile& profile);

// What the μ-TWO policy keeps free under a budget. On a CUDA device 4 MiB +
// 1% of the budget, for the caching allocator's block rounding (blocks are
// rounded to 512 B and a large block is not split when the rest would be
// under 1 MiB, so a step whose profile peaks at the budget can peak a few
// MB above it on the card: 0.3-2.4% measured on an H200 with small
// models). On the CPU, whose counting allocator counts exact bytes, 16 KiB
// + 1.5%: what the memory model leaves out of replays (small tensors a
// segment's replay holds for a moment: 0.1-0.9% above the prediction at
// the floor on the CPU zoo suite, 24 KiB on a 1 MiB GPT; fcn_resnet50's
// floor measured 1.06% above in one run).
inline constexpr int64_t kReserveFixedBytes = int64_t{4} << 20;
inline constexpr int64_t kCpuReserveFixedBytes = int64_t{16} << 10;
inline constexpr double kReserveFraction = 0.01;
inline constexpr double kCpuReserveFraction = 0.015;
int64_t AllocatorReserveBytes(const v1::Profile& profile, int64_t budget_bytes);

// The factor the profile's compute times are scaled by: the plain module
// step over the interpreted step synchronised after every node, when both
// are measured and the module step is the faster; else 1.
double TimeScale(const v1::MeasuredStep& measured);

// Each profile converted and paired with its batch size (errors name the
// profile's batch size).
[[nodiscard]] absl::StatusOr<std::vector<BatchProfile>> BatchProfilesFromProto(
    const std::vector<v1::Profile>& profiles);

// Budgets the Pareto sweep of `auto` (MemoryBudget.knee) tries when the
// request asks for no curve of its own.
inline constexpr int kKneeParetoPoints = 20;

// Bytes, a fraction of the baseline simulated peak, or a fraction of the
// device capacity. Errors: InvalidArgument for an unset or out-of-range
// budget, for `auto` (MemoryBudget.knee: PlanSchedule resolves it from the
// Pareto curve), or a device fraction when the device capacity is unknown.
[[nodiscard]] absl::StatusOr<int64_t> ResolveBudget(
    const v1::MemoryBudget& budget, int64_t baseline_peak_bytes,
    int64_t device_total_bytes);

// `mutwo`, `sqrt_n`, `per_block`, `none` (case-insensitive).
[[nodiscard]] absl::StatusOr<Policy> ParsePolicy(absl::string_view text);
Policy PolicyFromProto(v1::Policy policy);  // unspecified -> kMutwo
v1::Policy PolicyToProto(Policy policy);

struct ScheduleRequest {
  v1::MemoryBudget budget;
  v1::Policy policy = v1::MUTWO;
  bool allow_swap = true;
  int pareto_points = 0;  // 0: no Pareto sweep; otherwise >= 2 budgets
  int max_timeline_samples = 2048;  // 0: no timeline
  // Plan this many bytes below the budget on top of the allocator reserve
  // (Schedule.correction_bytes): what a validation measured above the
  // prediction. The schedule keeps the budget it was asked for; the Pareto
  // curve is not corrected.
  int64_t correction_bytes = 0;
  // μ-TWO plans below the budget by the device reserve
  // (AllocatorReserveBytes); false plans to the budget itself (`mutwo plan
  // --reserve=false`, and the planner's tests on synthetic profiles of a
  // few KB, where 16 KiB would leave nothing).
  bool device_reserve = true;
  // Stops the planner (a deadline, the caller leaving); not owned. When it
  // stopped, PlanSchedule answers its status (DeadlineExceeded or
  // Cancelled) instead of a schedule.
  Interrupt* interrupt = nullptr;
};

// Plans one profile for one budget: the whole v1::Schedule.
[[nodiscard]] absl::StatusOr<v1::Schedule> PlanSchedule(
    const v1::Profile& profile, const ScheduleRequest& request);

// Plans the graph of `profiles` (one model at two or more batch sizes) at
// `batch_size`, from the profile fitted to that batch size (as the max
// batch prediction does): a schedule for a batch size too large to profile
// without one. Decisions use the largest profile's ids. Errors as
// PredictMaxBatch's and PlanSchedule's.
[[nodiscard]] absl::StatusOr<v1::Schedule> PlanScheduleAtBatch(
    const std::vector<v1::Profile>& profiles, int64_t batch_size,
    const ScheduleRequest& request);

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

// Max batch size from profiles at two or more batch sizes. capacity_bytes 0
// means 95% of the first profile's device.total_bytes; max_overhead 0 means
// 0.25.
[[nodiscard]] absl::StatusOr<v1::MaxBatchPrediction> PredictMaxBatchProto(
    const std::vector<v1::Profile>& profiles, int64_t capacity_bytes,
    double max_overhead);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_PROTO_CONVERT_H_
