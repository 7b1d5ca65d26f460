// A job's progress as WatchJob streams it: a JobEvent built from the job
// and its tasks, with denominators fixed at submit time (batch sizes, batch
// sizes x budgets) and what workers run now. Pure functions over protos, so
// tests drive them without a server.
#ifndef MUTWO_SERVER_JOB_PROGRESS_H_
#define MUTWO_SERVER_JOB_PROGRESS_H_

#include <vector>

#include "mutwo/v1/planner.pb.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// The event for `job` now (`tasks`: all of the job's tasks). The final job
// is attached when the job is SUCCEEDED, FAILED or CANCELLED.
v1::JobEvent JobEventFor(const v1::Job& job,
                         const std::vector<v1::Task>& tasks);

// Whether `b` says something `a` did not: state, profiled batch sizes,
// decided budgets, waiting or what runs. The time stamp alone is not news,
// nor is tasks_total growing by a validation round, so a watcher sees no
// repeated lines.
bool ProgressChanged(const v1::JobEvent& a, const v1::JobEvent& b);

}  // namespace mutwo

#endif  // MUTWO_SERVER_JOB_PROGRESS_H_
