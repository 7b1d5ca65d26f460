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

#include <optional>
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
// job was submitted (0: unknown, no elapsed time). The time left is
// `left_ms` (nullopt: none shown; kLongerThanEstimated: says so), by default
// RawTimeLeftMs.
inline constexpr int64_t kLongerThanEstimated = -1;
std::string ProgressLine(const v1::JobEvent& event, int64_t created_unix_ms,
                         std::optional<int64_t> left_ms);
std::string ProgressLine(const v1::JobEvent& event, int64_t created_unix_ms);
// The time so far per unit of work (a batch size profiled, a budget
// decided) times the units left; none before the first unit, when the
// start is unknown, or once the job is final.
std::optional<int64_t> RawTimeLeftMs(const v1::JobEvent& event,
                                     int64_t created_unix_ms);

// The progress lines of one follow, event by event:
// - a line that would repeat the previous one (times aside) is not printed;
// - the moment between one task's report and the next lease (PROFILING or
//   VALIDATING with nothing running or waiting) is held and replaced by the
//   next event when that one has the same state and counts: one line per
//   step, naming the task that runs, not two;
// - the time left never goes up from one line to the next: the raw
//   estimate is capped by the previous one counted down; when that runs
//   out the line says "longer than estimated" and the next starts afresh.
class ProgressPrinter {
 public:
  ProgressPrinter(int64_t created_unix_ms, std::ostream& out);
  void Add(const v1::JobEvent& event);
  // Prints a held line (the stream ended).
  void Flush();

 private:
  void Print(const v1::JobEvent& event);
  std::optional<int64_t> TimeLeft(const v1::JobEvent& event);

  const int64_t created_unix_ms_;
  std::ostream& out_;
  std::string last_;  // the last line printed, without its times
  std::optional<v1::JobEvent> held_;
  std::optional<int64_t> shown_left_ms_;
  int64_t shown_at_unix_ms_ = 0;
};

// Follows `job_id` until it is final or `timeout_s` passes, printing on
// `progress` with a ProgressPrinter; returns the final job. A
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
