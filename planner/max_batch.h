// Largest batch size that fits a memory capacity, predicted from profiles of
// the same graph at two or more batch sizes. Every per-position allocator
// figure, step time, and activation size and time is fitted by least squares
// against the batch size; the profile extrapolated to a batch size is then
// simulated (without checkpointing) or planned (μ-TWO, within a maximum
// iteration-time overhead), and the largest fitting batch is found by
// doubling and bisection.
//
// The margin. A batch fits when its predicted peak, grown by the largest
// fraction by which a profile's measured allocator peak exceeded its
// simulated peak (fragmentation, workspaces the memory model leaves out),
// is at most the capacity less the allocator reserve the caller passes (the
// planner's reserve under a budget): both are what the profiles measured
// of the allocator, applied at every batch size. How far the answer lies
// beyond the largest profiled batch is reported (`extrapolation`).
#ifndef MUTWO_PLANNER_MAX_BATCH_H_
#define MUTWO_PLANNER_MAX_BATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"

namespace mutwo::planner {

struct BatchProfile {
  int64_t batch_size = 0;
  PlanProfile profile;
};

struct MaxBatchOptions {
  int64_t capacity_bytes = 0;  // required, > 0
  double max_overhead = 0.25;  // +25% iteration time
  bool allow_swap = true;
  int64_t max_batch_size = int64_t{1} << 20;  // search limit
  // Kept free below the capacity (AllocatorReserveBytes at the capacity);
  // >= 0.
  int64_t reserve_bytes = 0;
};

struct MaxBatchResult {
  int64_t capacity_bytes = 0;
  int64_t max_batch_without_checkpointing = 0;  // 0: not even batch 1
  int64_t max_batch_with_schedule = 0;
  double max_overhead = 0;
  std::vector<int64_t> profiled_batch_sizes;
  std::vector<int64_t> verify_batch_sizes;
  double bytes_per_sample = 0;  // fitted slope of the baseline peak
  int64_t bytes_intercept = 0;
  // The margin applied (see the file comment): predicted peaks are grown by
  // `fragmentation_fraction` and compared with capacity - reserve_bytes.
  double fragmentation_fraction = 0;
  int64_t reserve_bytes = 0;
  // max_batch_with_schedule / the largest profiled batch size.
  double extrapolation = 0;
  std::string reason;
};

// Errors: InvalidArgument for fewer than two distinct batch sizes, profiles
// of different graphs (node, step or activation counts or positions differ),
// or a non-positive capacity.
[[nodiscard]] absl::StatusOr<MaxBatchResult> PredictMaxBatch(
    const std::vector<BatchProfile>& profiles, const MaxBatchOptions& options);

// The profile fitted to `batch_size` (same validation as PredictMaxBatch).
[[nodiscard]] absl::StatusOr<PlanProfile> ExtrapolateProfile(
    const std::vector<BatchProfile>& profiles, int64_t batch_size);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_MAX_BATCH_H_
