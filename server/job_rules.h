// The rules a job obeys whatever step it is at: which states are final,
// what a valid spec and budget are (checked at SubmitJob and GetSchedule),
// and where a batch size's result lives in the job.
//
// Pure functions over the protos: no store, no clock, thread-safe.
// Errors: InvalidArgument naming the field and what to give instead.
#ifndef MUTWO_SERVER_JOB_RULES_H_
#define MUTWO_SERVER_JOB_RULES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/parse.h"  // ValidateBudget: the budget rule
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// SUCCEEDED, FAILED or CANCELLED: nothing changes a job's state any more.
bool IsFinal(v1::Job::State state);

// A job spec the service can run: inputs, 1 to 64 positive batch sizes, at
// most 32 valid budgets, a loss target when the loss needs one, a capacity
// in bytes or as a fraction of the device, max_overhead in [0, 10] and a
// known device kind.
[[nodiscard]] absl::Status ValidateSpec(const v1::JobSpec& spec);

// The job's result for `batch_size`, added (results stay ordered by batch
// size) when there is none yet. Valid until the job's results change.
v1::BatchResult* FindOrAddResult(v1::Job& job, int64_t batch_size);

}  // namespace mutwo

#endif  // MUTWO_SERVER_JOB_RULES_H_
