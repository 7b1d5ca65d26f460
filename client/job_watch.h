// Following a job to its end, for `mutwo submit --wait` and `mutwo watch`:
// streams WatchJob and prints one progress line per change on `progress`
// (stderr), each with the time of the change, the time since the job was
// submitted, the stage, what runs and counts against fixed denominators:
//
//   16:04:05 +1m23s  PROFILING   profiled 1/3 batch sizes, 0/6 budgets
//                                decided, ~6m32s left; running profile
//                                batch 16
//
// (the estimate: the time so far per batch size profiled or budget decided,
// times those left; none before the first nor once the job is final)
//
// then judges the final job for the exit code.
#ifndef MUTWO_CLIENT_JOB_WATCH_H_
#define MUTWO_CLIENT_JOB_WATCH_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "mutwo/v1/planner.grpc.pb.h"

namespace mutwo {

// Stops a FollowJob from another thread (Ctrl-C): Cancel() cancels the
// watch in flight and any later one. Thread-safe.
class FollowCancel {
 public:
  void Cancel();
  bool cancelled() const;
  // For FollowJob: the watch in flight (nullptr: none); false when already
  // cancelled (the watch is not opened).
  bool Attach(grpc::ClientContext* context);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// The progress line for `event` (no newline); `created_unix_ms` is when the
// job was submitted (0: unknown, no elapsed time).
std::string ProgressLine(const v1::JobEvent& event, int64_t created_unix_ms);

// Follows `job_id` until it is final or `timeout_s` passes; returns the
// final job. A line that would repeat the previous one is not printed. A
// watch refused with a retry hint (RESOURCE_EXHAUSTED, too many watches open)
// is opened again after the hint, within `timeout_s`. Cancelled (the job
// goes on) when `cancel` (may be null) is cancelled.
[[nodiscard]] absl::StatusOr<v1::Job> FollowJob(
    v1::Planner::Stub& stub, const std::string& job_id, int64_t created_unix_ms,
    int timeout_s, std::ostream& progress, FollowCancel* cancel = nullptr);

// The requested budgets (as typed) that fit at none of the job's batch
// sizes: no batch size has a FITS outcome for them.
std::vector<std::string> BudgetsFittingNowhere(const v1::Job& job);

// Exit code of a job followed to its end: 0 SUCCEEDED with every budget
// fitting at some batch size; 3 (kExitInfeasible) SUCCEEDED but a budget
// fits nowhere, with one line per such budget on `err`; 1 FAILED or
// CANCELLED.
int FinishedJobExitCode(const v1::Job& job, std::ostream& err);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_JOB_WATCH_H_
