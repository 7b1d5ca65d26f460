// Verifying a predicted max batch size by execution: a worker runs one
// training step at the predicted batch size (a MAX_BATCH task: the schedule
// planned for the job's capacity, or the unmodified step) and the answer is
// reported only as measured. A step over the capacity, or out of memory,
// steps the batch size down by what it measured and runs again, at most
// `max_rounds` steps.
//
// Pure functions over the protos (no store, no clock, thread-safe); JobCore
// sequences them.
#ifndef MUTWO_SERVER_MAX_BATCH_CHECK_H_
#define MUTWO_SERVER_MAX_BATCH_CHECK_H_

#include <cstdint>
#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

struct MaxBatchCheckOptions {
  int max_rounds = 3;  // steps per answer, the first included
};

// Whether the job's answers are run at all: on a CUDA device always; on the
// host only when the job gave a capacity (a step at 95% of the host's
// memory would take the machine). Empty when they run, else why not.
std::string WhyNotVerified(const v1::JobSpec& spec,
                           const v1::DeviceInfo& device);

// A check queued at `batch_size` (from the prediction, rounds 0).
v1::MaxBatchCheck QueuedCheck(int64_t batch_size, int64_t capacity_bytes);
// A check that will not run, with the reason.
v1::MaxBatchCheck UnverifiedCheck(int64_t batch_size, int64_t capacity_bytes,
                                  const std::string& reason);

// What follows a step at `check.batch_size()` that measured `validation`.
struct MaxBatchStep {
  enum class Next {
    kVerified,  // within the capacity
    kStepDown,  // over it or out of memory, steps left: run `next_batch`
    kFailed,    // over it in the last step, or the step failed otherwise
  };
  Next next = Next::kFailed;
  int64_t next_batch = 0;
  v1::MaxBatchCheck check;  // updated with the step's measurement
};
MaxBatchStep JudgeMaxBatchStep(const v1::MaxBatchCheck& check,
                               const v1::Validation& validation,
                               const MaxBatchCheckOptions& options);

// The check of `prediction` whose queued batch size and schedule policy
// match a MAX_BATCH task (NONE: without checkpointing); nullptr if none.
v1::MaxBatchCheck* CheckForTask(v1::MaxBatchPrediction& prediction,
                                const v1::Task& task);

}  // namespace mutwo

#endif  // MUTWO_SERVER_MAX_BATCH_CHECK_H_
