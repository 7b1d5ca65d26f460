// WorkerQuarantine: stops leasing to a worker that keeps failing. A worker
// token can fail every task it leases (each failure costs the job an
// attempt; enough of them fail the job) or send reports the server refuses
// (forged fences, malformed or oversized profiles). Each such event is
// counted per worker id; max_failures of them within window_ms put the
// worker in quarantine for quarantine_ms: its lease polls are refused with
// FailedPrecondition naming why and until when, so it leases nothing more
// while honest workers take its tasks.
//
// What counts: a task the worker failed (FailTask accepted), and a report
// refused with InvalidArgument, ResourceExhausted, PermissionDenied or
// NotFound (the worker sent something wrong). Not counted: a report refused
// with FailedPrecondition (its lease moved on: the server's timing, not the
// worker's fault) and transport errors.
//
// Per worker id, not per principal: workers often share one token, and one
// bad GPU must not stop the fleet. A rogue token can register a fresh
// worker id; revoke the token (remove it from --auth_tokens_file). The
// quarantine lives in memory: a restart lifts it.
//
// Thread safety: every method is thread-safe.
#ifndef MUTWO_SERVER_WORKER_QUARANTINE_H_
#define MUTWO_SERVER_WORKER_QUARANTINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mutwo {

class WorkerQuarantine {
 public:
  struct Options {
    // Failures within window_ms that quarantine a worker
    // (--worker_quarantine_failures); 0: never.
    int max_failures = 10;
    int64_t window_ms = 10 * 60 * 1000;
    int64_t quarantine_ms = 60 * 60 * 1000;
    // Metrics (may be empty), called with the lock held: the workers in
    // quarantine now, and each new quarantine.
    std::function<void(int quarantined)> observe_quarantined;
    std::function<void()> observe_new;
  };

  // InvalidArgument for a negative count or non-positive durations.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WorkerQuarantine>> Create(
      Options options);

  // A task `worker_id` failed, with the worker's reason.
  void TaskFailed(const std::string& worker_id, const std::string& reason);
  // The result of a report by `worker_id`: counted when refused as above.
  void ReportAnswered(const std::string& worker_id, const absl::Status& status);
  // OK, or FailedPrecondition when `worker_id` is in quarantine.
  [[nodiscard]] absl::Status CheckLease(const std::string& worker_id);
  int quarantined();

 private:
  explicit WorkerQuarantine(Options options) : options_(std::move(options)) {}
  void Count(const std::string& worker_id, std::string why);
  void Prune(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Worker {
    std::deque<absl::Time> failures;  // within the window
    std::string last_why;
    absl::Time until = absl::InfinitePast();  // in quarantine before this
    int failures_when_quarantined = 0;
  };
  const Options options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_WORKER_QUARANTINE_H_
