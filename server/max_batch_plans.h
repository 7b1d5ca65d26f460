// What a job's max batch size prediction is checked with: the capacity it
// is predicted for, the schedules its MAX_BATCH tasks run (planned for the
// capacity from every profile of the job), and the profiles they are
// planned from. max_batch_check.h judges each step once it ran; JobCore
// sequences both (profile reports queue the first steps, MAX_BATCH reports
// the next).
//
// Functions over the protos and the planner; DoneProfiles reads the store
// (not owned). Thread-safe.
// Errors: the planner's (a batch size or capacity no schedule can be
// planned for) and the store's.
#ifndef MUTWO_SERVER_MAX_BATCH_PLANS_H_
#define MUTWO_SERVER_MAX_BATCH_PLANS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"
#include "storage/store.h"

namespace mutwo {

// The capacity the max batch size is predicted for; 0: the predictor's
// default (95% of the device).
int64_t CapacityBytes(const v1::JobSpec& spec, const v1::DeviceInfo& device);

// The schedule a MAX_BATCH task runs at `batch_size`: planned for the
// capacity from the profiles fitted to that batch size, below it by the
// margin the prediction kept for fragmentation (`margin_bytes`, on top of
// the allocator reserve), as the answer was; policy NONE for the answer
// without checkpointing.
[[nodiscard]] absl::StatusOr<v1::Schedule> MaxBatchSchedule(
    const std::vector<v1::Profile>& profiles, int64_t batch_size,
    int64_t capacity_bytes, v1::Policy policy, int64_t margin_bytes);

// What the prediction planned below the capacity and its reserve for the
// fragmentation the profiles measured (max_batch.h: the largest predicted
// peak is (capacity - reserve) / (1 + fraction)).
int64_t FragmentationMarginBytes(const v1::MaxBatchPrediction& m);

// Sets the checks of a fresh prediction and returns the MAX_BATCH tasks'
// schedules: one step at each answer (one when both answers are the same
// batch size: the unmodified step proves both), or why it is not run.
std::vector<v1::Schedule> PrepareMaxBatchChecks(
    const v1::JobSpec& spec, const std::vector<v1::Profile>& profiles,
    v1::MaxBatchPrediction& m);

// Whether a PROFILE task of the job other than `task` is still to report.
bool OtherProfilePending(const std::vector<v1::Task>& tasks,
                         const v1::Task& task);

// A prediction from a report that is not the job's last profile: its
// checks wait for the prediction over every profile.
void DeferMaxBatchChecks(v1::MaxBatchPrediction& m);

// The batch sizes of the job's DONE PROFILE tasks among `tasks` (except
// task `skip_task_id`), in task order.
std::vector<int64_t> DoneProfileBatches(const std::vector<v1::Task>& tasks,
                                        const std::string& skip_task_id = "");

// The stored profiles at `batch_sizes` that did not run out of memory (the
// ones a prediction can use); a profile the store cannot read is left out.
std::vector<v1::Profile> UsableProfiles(
    storage::Store& store, const std::string& job_id,
    const std::vector<int64_t>& batch_sizes);

}  // namespace mutwo

#endif  // MUTWO_SERVER_MAX_BATCH_PLANS_H_
