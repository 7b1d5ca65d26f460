#include "server/planning_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/waiters.h"

namespace mutwo {

absl::StatusOr<std::unique_ptr<PlanningPool>> PlanningPool::Create(
    Options options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--planning_threads must be at least 1, got ", options.threads));
  }
  if (options.max_queued < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_queued_reports must be 0 or more, got ", options.max_queued));
  }
  return std::unique_ptr<PlanningPool>(new PlanningPool(options));
}

PlanningPool::PlanningPool(Options options) : options_(options) {
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

PlanningPool::~PlanningPool() {
  Stop();
  Join();
}

absl::Status PlanningPool::Submit(Work work) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::UnavailableError(
        "the server is shutting down; report again to the next server");
  }
  const int waiting = static_cast<int>(queue_.size());
  if (running_ + waiting >= options_.threads + options_.max_queued) {
    return WaiterSet::RetryLater(
        absl::StrCat(
            "the server is planning ", running_, " profile reports and ",
            waiting, " wait (--planning_threads=", options_.threads,
            ", --max_queued_reports=", options_.max_queued, "); report again"),
        options_.retry_after_ms);
  }
  queue_.push_back(std::move(work));
  return absl::OkStatus();
}

void PlanningPool::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

bool PlanningPool::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void PlanningPool::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void PlanningPool::Run() {
  if (options_.nice != 0) {
    // Linux applies PRIO_PROCESS with a thread id to that thread alone.
    const int tid = static_cast<int>(syscall(SYS_gettid));
    const int now = getpriority(PRIO_PROCESS, tid);
    if (setpriority(PRIO_PROCESS, tid, now + options_.nice) != 0) {
      MUTWO_LOG(warn, "planning thread: cannot lower its priority by {}",
                options_.nice);
    }
  }
  const std::function<bool()> stop = [this] { return stopped(); };
  for (;;) {
    Work work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      // Stop() wakes the wait at once; the timeout only bounds it.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (queue_.empty()) {
        if (stopping_) return;
        continue;
      }
      work = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    work(stop);
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace mutwo
