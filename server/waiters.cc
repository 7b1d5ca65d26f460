#include "server/waiters.h"

#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mutwo {
namespace {
constexpr char kRetryAfterPayload[] = "type.mutwo.dev/retry-after-ms";
}  // namespace

absl::StatusOr<std::unique_ptr<WaiterSet>> WaiterSet::Create(Options options) {
  if (options.max_waiters < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.flag.empty() ? options.what : options.flag,
                     " must be at least 1, got ", options.max_waiters));
  }
  if (options.retry_after_ms < 1) {
    return absl::InvalidArgumentError("retry_after_ms must be positive");
  }
  return std::unique_ptr<WaiterSet>(new WaiterSet(std::move(options)));
}

WaiterSet::WaiterSet(Options options) : options_(std::move(options)) {
  dispatcher_ = std::thread([this] { Dispatch(); });
}

WaiterSet::~WaiterSet() { Shutdown(); }

absl::StatusOr<uint64_t> WaiterSet::Add(Waiter* waiter, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::UnavailableError("the server is shutting down; retry");
  }
  if (static_cast<int>(entries_.size()) >= options_.max_waiters) {
    absl::Status refused = RetryLater(
        absl::StrCat(
            options_.what, ": ", options_.max_waiters, " open, the limit",
            options_.flag.empty() ? "" : absl::StrCat(" (", options_.flag, ")"),
            "; retry in ", options_.retry_after_ms, " ms"),
        options_.retry_after_ms);
    if (options_.observe_refused) options_.observe_refused();
    return refused;
  }
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{waiter, deadline});
  Observe();
  pending_ = true;
  work_.Signal();
  return id;
}

void WaiterSet::Notify() {
  absl::MutexLock lock(&mu_);
  if (entries_.empty()) return;
  for (auto& [id, entry] : entries_) entry.changed = true;
  pending_ = true;
  work_.Signal();
}

void WaiterSet::Wake(uint64_t id, Why why) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  if (why == Why::kCancelled) it->second.cancelled = true;
  it->second.changed = true;
  pending_ = true;
  work_.Signal();
}

void WaiterSet::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, entry] : entries_) entry.changed = true;
    pending_ = true;
    work_.Signal();
  }
  if (dispatcher_.joinable()) dispatcher_.join();
}

int WaiterSet::size() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

void WaiterSet::Observe() {
  if (options_.observe_waiting) {
    options_.observe_waiting(static_cast<int>(entries_.size()));
  }
}

absl::Status WaiterSet::RetryLater(const std::string& message,
                                   int64_t retry_after_ms) {
  absl::Status refused = absl::ResourceExhaustedError(message);
  refused.SetPayload(kRetryAfterPayload,
                     absl::Cord(absl::StrCat(retry_after_ms)));
  return refused;
}

std::optional<int64_t> WaiterSet::RetryAfterMs(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) {
    return std::nullopt;
  }
  return ms;
}

void WaiterSet::Dispatch() {
  std::vector<std::pair<uint64_t, Waiter*>> due;
  std::vector<Why> why;
  absl::MutexLock lock(&mu_);
  while (true) {
    // Sleep until something is flagged, a deadline passes or we stop.
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [id, entry] : entries_) {
      if (!entry.told_to_finish) next = std::min(next, entry.deadline);
    }
    while (!pending_ && absl::Now() < next) {
      work_.WaitWithDeadline(&mu_, next);
    }
    pending_ = false;
    const absl::Time now = absl::Now();
    due.clear();
    why.clear();
    for (auto& [id, entry] : entries_) {
      // A waiter told to finish that could not yet (a write in flight) is
      // told again only when woken, not in a busy loop.
      if (entry.told_to_finish && !entry.changed) continue;
      std::optional<Why> w;
      if (entry.cancelled) {
        w = Why::kCancelled;
      } else if (stopping_) {
        w = Why::kShutdown;
      } else if (now >= entry.deadline) {
        w = Why::kDeadline;
      } else if (entry.changed) {
        w = Why::kChanged;
      }
      if (!w.has_value()) continue;
      entry.changed = false;
      if (*w != Why::kChanged) entry.told_to_finish = true;
      due.emplace_back(id, entry.waiter);
      why.push_back(*w);
    }
    if (stopping_ && entries_.empty()) return;
    // Wake without the lock: a waiter reads the store and answers its RPC.
    mu_.Unlock();
    std::vector<uint64_t> finished;
    for (size_t i = 0; i < due.size(); ++i) {
      if (due[i].second->OnWake(why[i])) finished.push_back(due[i].first);
    }
    mu_.Lock();
    for (uint64_t id : finished) entries_.erase(id);
    if (!finished.empty()) Observe();
    // A waiter that must finish but did not (a write still in flight) is
    // looked at again once it is woken (its write completes).
    if (stopping_ && entries_.empty()) return;
  }
}

}  // namespace mutwo
