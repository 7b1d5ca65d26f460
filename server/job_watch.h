// JobWatch: one WatchJob stream, as a waiter that holds no thread. It is
// woken when something changed (JobCore::NotifyChange), when its last write
// completed, when its client left and at shutdown; each time it reads the job
// and, when a watcher would see something new, starts one write through its
// Sink (at most one write in flight). The final event ends the stream.
//
// Ownership: the RPC's reactor owns the JobWatch and its Sink; the watch
// must live until it finished (a Sink call that ends the stream, after which
// it is never touched again by the core).
// Thread safety: OnWake runs on the watchers' dispatcher thread, WriteDone
// on a gRPC thread; shared state is under a mutex.
#ifndef MUTWO_SERVER_JOB_WATCH_H_
#define MUTWO_SERVER_JOB_WATCH_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "mutwo/v1/planner.pb.h"
#include "server/job_core.h"
#include "server/waiters.h"

namespace mutwo {

class JobWatch : public WaiterSet::Waiter {
 public:
  struct Sink {
    // Starts writing `event`; the writer calls WriteDone when it completed.
    std::function<void(const v1::JobEvent& event)> write;
    // Writes the final event and ends the stream with OK.
    std::function<void(const v1::JobEvent& event)> write_last;
    // Ends the stream with `status` (no write in flight).
    std::function<void(const absl::Status& status)> finish;
  };

  JobWatch(JobCore* core, std::string job_id, Sink sink)
      : core_(core), job_id_(std::move(job_id)), sink_(std::move(sink)) {}

  // Registers the watch (JobCore::AddWatch). On error nothing is registered
  // and the caller ends the stream.
  [[nodiscard]] absl::Status Start();
  // The client left (the reactor's OnCancel).
  void Cancel();
  // The write started by Sink::write completed (`ok` false: the stream is
  // broken, the client left).
  void WriteDone(bool ok);
  bool OnWake(WaiterSet::Why why) override;

 private:
  JobCore* core_;
  const std::string job_id_;
  Sink sink_;
  uint64_t id_ = 0;  // set by Start, before any wake can need it

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // Touched by OnWake only (one dispatcher thread).
  int64_t seen_version_ = -1;
  std::optional<v1::JobEvent> last_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_JOB_WATCH_H_
