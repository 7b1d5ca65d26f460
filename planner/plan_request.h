// Planning from protos: one profile (or a model's profiles at several batch
// sizes) and a v1::MemoryBudget in, a v1::Schedule or v1::MaxBatchPrediction
// out. Resolves the budget (bytes, fractions, `auto`: the knee of the Pareto
// curve) and plans below it by the allocator reserve. Used by the server and
// by the offline `mutwo plan` command. Stateless and thread-safe.
#ifndef MUTWO_PLANNER_PLAN_REQUEST_H_
#define MUTWO_PLANNER_PLAN_REQUEST_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"
#include "planner/interrupt.h"

namespace mutwo::planner {

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

// Max batch size from profiles at two or more batch sizes. capacity_bytes 0
// means 95% of the first profile's device.total_bytes; max_overhead 0 means
// 0.25.
[[nodiscard]] absl::StatusOr<v1::MaxBatchPrediction> PredictMaxBatchProto(
    const std::vector<v1::Profile>& profiles, int64_t capacity_bytes,
    double max_overhead);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_PLAN_REQUEST_H_
