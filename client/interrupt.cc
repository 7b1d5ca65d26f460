#include "client/interrupt.h"

#include <pthread.h>
#include <signal.h>

#include <ctime>
#include <utility>

namespace mutwo {
namespace {

sigset_t InterruptSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

InterruptWatcher::InterruptWatcher() {
  const sigset_t set = InterruptSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this] { Run(); });
}

InterruptWatcher::~InterruptWatcher() {
  stop_ = true;
  thread_.join();
}

void InterruptWatcher::SetHandler(std::function<void()> on_interrupt) {
  absl::MutexLock lock(&mu_);
  handler_ = std::move(on_interrupt);
}

void InterruptWatcher::ClearHandler() {
  absl::MutexLock lock(&mu_);
  handler_ = nullptr;
}

void InterruptWatcher::Run() {
  const sigset_t set = InterruptSet();
  // A bounded wait, so that the destructor's stop is seen within 100 ms.
  const timespec poll = {0, 100'000'000};
  while (!stop_) {
    if (sigtimedwait(&set, nullptr, &poll) != SIGINT) continue;
    std::function<void()> handler;
    {
      absl::MutexLock lock(&mu_);
      handler = handler_;
    }
    if (handler) {
      handler();
      continue;
    }
    // No handler: end the process by SIGINT, as without the watcher (the
    // shell sees a process killed by the signal).
    signal(SIGINT, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    raise(SIGINT);
  }
}

}  // namespace mutwo
