// Settling a job: after any change to its tasks (a report, a failure, a
// lease that expired, a cancel, a submit) the job's state and counters are
// recomputed from its tasks, inside the transaction that changed them, so
// tasks and job state always change together:
//   a PROFILE task pending       -> QUEUED (none started yet) or PROFILING
//   else another task pending    -> VALIDATING
//   else every profile failed    -> FAILED with the first task error
//   else no task at all          -> FAILED (an interrupted submit)
//   else                         -> SUCCEEDED (with the first error, if any)
// A final job keeps its state. A VALIDATE or MAX_BATCH task that failed or
// was cancelled ends its budget's outcome or its max batch check with the
// task's reason, whatever the job's state.
//
// Ownership: nothing kept; the Writer is the caller's transaction.
// Thread safety: as the Writer (one transaction, one thread).
// Errors: the store's (NotFound for an unknown job).
#ifndef MUTWO_SERVER_JOB_SETTLING_H_
#define MUTWO_SERVER_JOB_SETTLING_H_

#include <string>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"
#include "storage/store.h"

namespace mutwo {

// Settles job `job_id` in `w` (see above) and returns the job as stored.
[[nodiscard]] absl::StatusOr<v1::Job> SettleJobIn(storage::Store::Writer& w,
                                                  const std::string& job_id);

}  // namespace mutwo

#endif  // MUTWO_SERVER_JOB_SETTLING_H_
