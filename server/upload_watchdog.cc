#include "server/upload_watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mutwo {

absl::StatusOr<std::unique_ptr<UploadWatchdog>> UploadWatchdog::Create(
    Options options) {
  if (options.idle_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--upload_idle_timeout_ms must be at least 1, got ",
                     options.idle_timeout_ms));
  }
  return std::unique_ptr<UploadWatchdog>(
      new UploadWatchdog(std::move(options)));
}

UploadWatchdog::UploadWatchdog(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

UploadWatchdog::~UploadWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_.Signal();
  }
  thread_.join();
}

std::unique_ptr<UploadWatchdog::Guard> UploadWatchdog::Watch(
    grpc::ServerContextBase* context) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{context, absl::Now()});
  return std::unique_ptr<Guard>(new Guard(this, id));
}

UploadWatchdog::Guard::~Guard() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->entries_.erase(id_);
}

void UploadWatchdog::Guard::Touch() {
  absl::MutexLock lock(&owner_->mu_);
  auto it = owner_->entries_.find(id_);
  if (it != owner_->entries_.end()) it->second.last = absl::Now();
}

bool UploadWatchdog::Guard::dropped() {
  absl::MutexLock lock(&owner_->mu_);
  auto it = owner_->entries_.find(id_);
  return it != owner_->entries_.end() && it->second.dropped;
}

void UploadWatchdog::Run() {
  const absl::Duration idle = absl::Milliseconds(options_.idle_timeout_ms);
  // Checked four times per timeout (at most once a second): an idle
  // upload is dropped within 1.25 timeouts.
  const absl::Duration tick =
      std::min(idle / 4, absl::Seconds(1)) + absl::Milliseconds(1);
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    stop_.WaitWithTimeout(&mu_, tick);
    const absl::Time now = absl::Now();
    for (auto& [id, entry] : entries_) {
      if (entry.dropped || now - entry.last < idle) continue;
      entry.dropped = true;
      entry.context->TryCancel();
      if (options_.observe_dropped) options_.observe_dropped();
    }
  }
}

}  // namespace mutwo
