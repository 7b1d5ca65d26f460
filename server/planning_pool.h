// PlanningPool: the threads that plan profile reports, off gRPC's threads.
// A profile report plans the knee and every budget of its job (up to 33
// plans); run on the RPC thread, a few of them held every thread of the
// server and cheap reads (GetJob) waited behind them. ReportProfile is a
// callback-API method that hands its work here and returns; the work
// answers the call when it ends.
//
// Bounded: `threads` plans run at once and `max_queued` wait; more are
// refused (ResourceExhausted naming --planning_threads and
// --max_queued_reports) and the worker reports again later. Each work item
// gets a `stop` callback that turns true once Stop() is called (the server
// drains): its planning polls it and ends within one planner step.
//
// The threads run at a lower CPU priority than the process (Options::nice).
//
// Owns its threads: Stop() then Join() (the destructor does both). Work
// queued when Stop() is called still runs, with `stop` already true, so
// every accepted call is answered. Thread-safe.
#ifndef MUTWO_SERVER_PLANNING_POOL_H_
#define MUTWO_SERVER_PLANNING_POOL_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mutwo {

class PlanningPool {
 public:
  struct Options {
    int threads = 2;     // --planning_threads
    int max_queued = 8;  // --max_queued_reports
    // Added to the threads' nice value (Linux: per thread), so that on a
    // busy machine the RPC threads, which answer cheap reads, win the CPU
    // over planning. 0: as the process.
    int nice = 10;
    // The retry hint of a refusal (WaiterSet::RetryAfterMs reads it): a
    // report plans for seconds.
    int64_t retry_after_ms = 1000;
  };
  using Work = std::function<void(const std::function<bool()>& stop)>;

  // InvalidArgument naming the flag for threads < 1 or max_queued < 0.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PlanningPool>> Create(
      Options options);
  ~PlanningPool();
  PlanningPool(const PlanningPool&) = delete;
  PlanningPool& operator=(const PlanningPool&) = delete;

  // Queues `work`. ResourceExhausted with a retry hint when threads are
  // busy and max_queued wait; Unavailable once stopped. Nothing runs on
  // refusal.
  [[nodiscard]] absl::Status Submit(Work work);
  // Running and queued work sees `stop` true from now on.
  void Stop();
  // Waits for every accepted item to end (call Stop() first).
  void Join();
  bool stopped() const;

 private:
  explicit PlanningPool(Options options);
  void Run();

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<Work> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_PLANNING_POOL_H_
