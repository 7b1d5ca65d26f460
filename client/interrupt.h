// Ctrl-C (SIGINT) for the commands that follow a job (`submit --wait`,
// `watch`): the job runs on the server whatever the client does, so an
// interrupted follow says so and how to pick the job up again instead of
// vanishing silently.
//
// InterruptWatcher blocks SIGINT and waits for it on one thread of its own
// with sigtimedwait (no work in a signal handler). Without a handler set,
// SIGINT ends the process as it would without the watcher; with one, the
// handler runs on the watcher's thread instead.
//
// Create the watcher before the command's first RPC: the signal mask is
// inherited by threads when they start, and gRPC starts its threads with
// the first channel. SIGINT stays blocked in the threads that inherited the
// mask after the watcher is gone, so it lives as long as the command.
#ifndef MUTWO_CLIENT_INTERRUPT_H_
#define MUTWO_CLIENT_INTERRUPT_H_

#include <atomic>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mutwo {

class InterruptWatcher {
 public:
  InterruptWatcher();
  // Stops and joins the watcher's thread.
  ~InterruptWatcher();
  InterruptWatcher(const InterruptWatcher&) = delete;
  InterruptWatcher& operator=(const InterruptWatcher&) = delete;

  // Each SIGINT from now on calls `on_interrupt` on the watcher's thread
  // (it must be quick and thread-safe); ClearHandler() restores the
  // default (the process ends).
  void SetHandler(std::function<void()> on_interrupt);
  void ClearHandler();

 private:
  void Run();

  absl::Mutex mu_;
  std::function<void()> handler_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace mutwo

#endif  // MUTWO_CLIENT_INTERRUPT_H_
