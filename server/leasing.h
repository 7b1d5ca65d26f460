// Leasing: how tasks reach workers and come back when workers go silent.
// Long polls (LeaseTask), heartbeats (lease extension, deregistration) and
// the reaper thread (expired leases re-queued, silent workers marked LOST,
// long-gone ones forgotten). The job state machine stays in JobCore: after a
// task changes hands Leasing calls Hooks::settle for its job, and
// Hooks::notify_change so that waiters look again.
//
// Long polls hold no thread: a LeasePoll is registered in a WaiterSet
// (waiters.h) and woken when something changes, at its deadline, when its
// caller cancels or at shutdown. At most Options::max_lease_waiters polls wait
// at once; more are refused with ResourceExhausted and a retry hint.
//
// Thread safety: every public method is thread-safe. Start() starts the
// reaper; Shutdown() ends every poll (no task) and stops the reaper.
#ifndef MUTWO_SERVER_LEASING_H_
#define MUTWO_SERVER_LEASING_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mutwo/v1/worker_hub.pb.h"
#include "server/waiters.h"
#include "storage/store.h"

namespace mutwo {

class Leasing;

// One LeaseTask long poll. `done` is called exactly once, from the thread
// that finishes the poll: with a task, with no task (the wait ended or the
// server stops), or with an error (Cancelled when `cancelled` says the
// caller left; a task leased for such a caller is given back at once).
class LeasePoll : public WaiterSet::Waiter {
 public:
  using Done = std::function<void(absl::StatusOr<v1::LeaseTaskResponse>)>;
  LeasePoll(Leasing* leasing, v1::LeaseTaskRequest request,
            std::function<bool()> cancelled, Done done)
      : leasing_(leasing),
        request_(std::move(request)),
        cancelled_(std::move(cancelled)),
        done_(std::move(done)) {}
  bool OnWake(WaiterSet::Why why) override;

 private:
  friend class Leasing;
  Leasing* leasing_;
  v1::LeaseTaskRequest request_;
  std::function<bool()> cancelled_;
  Done done_;
  std::string device_kind_;
  bool first_ = true;
};

class Leasing {
 public:
  struct Options {
    int64_t lease_timeout_ms = 30000;
    int max_attempts = 3;
    int64_t worker_lost_after_ms = 90000;
    int64_t worker_forget_after_ms = 60 * 60 * 1000;
    int64_t reaper_interval_ms = 500;
    int64_t max_lease_wait_ms = 30000;
    // Lease polls waiting at once (--max_lease_waiters) and the retry hint
    // of a refusal.
    int max_lease_waiters = 1000;
    int64_t waiter_retry_after_ms = 1000;
  };
  // What Leasing needs of the job state machine.
  struct Hooks {
    // Recompute a job's state after one of its tasks changed hands.
    std::function<absl::Status(const std::string& job_id, bool refresh_gauges)>
        settle;
    std::function<void()> refresh_gauges;
    // Something changed: waiters look again.
    std::function<void()> notify_change;
    // Metrics of the polls (WaiterSet::Options; may be empty).
    std::function<void(int waiting)> observe_waiting_polls;
    std::function<void()> observe_refused_poll;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Leasing>> Create(
      Options options, storage::Store* store, Hooks hooks);
  ~Leasing();
  void Start();
  void Shutdown();

  // Registers `poll` (which must live until its done callback ran) and
  // returns its id for CancelPoll. Errors (nothing registered, done not
  // called): NotFound for an unknown worker, FailedPrecondition for a
  // STOPPED one, ResourceExhausted (WaiterSet::RetryAfterMs) when
  // max_lease_waiters polls already wait, Unavailable when shutting down.
  [[nodiscard]] absl::StatusOr<uint64_t> StartPoll(LeasePoll* poll);
  // The caller of poll `id` left: it ends at once (Cancelled).
  void CancelPoll(uint64_t id);
  // A poll that blocks the calling thread (tests, tools); `cancelled` is
  // asked every 50 ms.
  [[nodiscard]] absl::StatusOr<v1::LeaseTaskResponse> LeaseTask(
      const v1::LeaseTaskRequest& request,
      std::function<bool()> cancelled = nullptr);
  // Asked with the worker id before a poll starts and before each lease
  // (the quarantine, worker_quarantine.h): an error ends the poll with it.
  // Set before the server serves.
  void SetLeaseCheck(
      std::function<absl::Status(const std::string& worker_id)> check) {
    lease_check_ = std::move(check);
  }
  // Wakes every poll: something changed.
  void Notify();
  int waiting_polls();

  [[nodiscard]] absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);
  // One reaper pass (also called by tests).
  void Reap();

 private:
  friend class LeasePoll;
  Leasing(Options options, storage::Store* store, Hooks hooks,
          std::unique_ptr<WaiterSet> polls);
  // One attempt of `poll`: a task, or none yet. Never blocks on a wait.
  absl::StatusOr<std::optional<v1::LeaseTaskResponse>> TryLease(
      LeasePoll& poll);

  const Options options_;
  storage::Store* store_;
  Hooks hooks_;
  std::unique_ptr<WaiterSet> polls_;
  std::function<absl::Status(const std::string&)> lease_check_;

  absl::Mutex mu_;
  absl::CondVar stop_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_LEASING_H_
