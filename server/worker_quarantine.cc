#include "server/worker_quarantine.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace mutwo {
namespace {
// The worker's own words are kept for the refusal message, cut short.
constexpr size_t kMaxWhyBytes = 200;
}  // namespace

absl::StatusOr<std::unique_ptr<WorkerQuarantine>> WorkerQuarantine::Create(
    Options options) {
  if (options.max_failures < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_quarantine_failures must be 0 (off) or more, "
                     "got ",
                     options.max_failures));
  }
  if (options.window_ms < 1 || options.quarantine_ms < 1) {
    return absl::InvalidArgumentError(
        "--worker_quarantine_window_ms and --worker_quarantine_ms must be "
        "positive");
  }
  return std::unique_ptr<WorkerQuarantine>(
      new WorkerQuarantine(std::move(options)));
}

void WorkerQuarantine::TaskFailed(const std::string& worker_id,
                                  const std::string& reason) {
  Count(worker_id, absl::StrCat("task failed: ", reason));
}

void WorkerQuarantine::ReportAnswered(const std::string& worker_id,
                                      const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kNotFound:
      Count(worker_id, absl::StrCat("report refused: ", status.message()));
      return;
    default:
      return;
  }
}

void WorkerQuarantine::Count(const std::string& worker_id, std::string why) {
  if (options_.max_failures == 0 || worker_id.empty()) return;
  if (why.size() > kMaxWhyBytes) why = why.substr(0, kMaxWhyBytes) + "...";
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker_id];
  w.failures.push_back(now);
  w.last_why = std::move(why);
  const absl::Time since = now - absl::Milliseconds(options_.window_ms);
  while (!w.failures.empty() && w.failures.front() < since) {
    w.failures.pop_front();
  }
  if (now < w.until ||
      static_cast<int>(w.failures.size()) < options_.max_failures) {
    return;
  }
  w.until = now + absl::Milliseconds(options_.quarantine_ms);
  w.failures_when_quarantined = static_cast<int>(w.failures.size());
  w.failures.clear();
  MUTWO_LOG(warn,
            "worker {} quarantined for {} ms: {} failures within {} ms, the "
            "last: {}",
            worker_id, options_.quarantine_ms, w.failures_when_quarantined,
            options_.window_ms, w.last_why);
  if (options_.observe_new) options_.observe_new();
  Prune(now);
}

absl::Status WorkerQuarantine::CheckLease(const std::string& worker_id) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  Prune(now);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || now >= it->second.until) {
    return absl::OkStatus();
  }
  const Worker& w = it->second;
  return absl::FailedPreconditionError(absl::StrCat(
      "worker ", worker_id, " is quarantined for ",
      absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(w.until - now))),
      " more: ", w.failures_when_quarantined, " failures within ",
      options_.window_ms,
      " ms (--worker_quarantine_failures, "
      "--worker_quarantine_window_ms), the last: ",
      w.last_why, "; it is leased nothing until then"));
}

int WorkerQuarantine::quarantined() {
  absl::MutexLock lock(&mu_);
  Prune(absl::Now());
  int n = 0;
  for (const auto& [id, w] : workers_) n += absl::Now() < w.until ? 1 : 0;
  return n;
}

void WorkerQuarantine::Prune(absl::Time now) {
  const absl::Time since = now - absl::Milliseconds(options_.window_ms);
  int in_quarantine = 0;
  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker& w = it->second;
    while (!w.failures.empty() && w.failures.front() < since) {
      w.failures.pop_front();
    }
    if (now < w.until) ++in_quarantine;
    if (w.failures.empty() && now >= w.until) {
      workers_.erase(it++);
    } else {
      ++it;
    }
  }
  if (options_.observe_quarantined) {
    options_.observe_quarantined(in_quarantine);
  }
}

}  // namespace mutwo
