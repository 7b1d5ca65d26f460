#include "server/job_watch.h"

#include <utility>
#include <vector>

#include "server/job_progress.h"

namespace mutwo {
namespace {

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

}  // namespace

absl::Status JobWatch::Start() {
  absl::StatusOr<uint64_t> id = core_->AddWatch(this);
  if (!id.ok()) return id.status();
  id_ = *id;
  return absl::OkStatus();
}

void JobWatch::Cancel() {
  if (id_ != 0) core_->WakeWatch(id_, WaiterSet::Why::kCancelled);
}

void JobWatch::WriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) broken_ = true;
  }
  // Look again: what changed while the write was in flight, or finish.
  core_->WakeWatch(id_,
                   ok ? WaiterSet::Why::kChanged : WaiterSet::Why::kCancelled);
}

bool JobWatch::OnWake(WaiterSet::Why why) {
  {
    absl::MutexLock lock(&mu_);
    // Nothing ends the stream while a write is in flight; WriteDone wakes
    // the watch again.
    if (writing_) return false;
    if (broken_) why = WaiterSet::Why::kCancelled;
  }
  switch (why) {
    case WaiterSet::Why::kCancelled:
      sink_.finish(absl::CancelledError("client went away"));
      return true;
    case WaiterSet::Why::kShutdown:
    case WaiterSet::Why::kDeadline:
      // The job will not change any more from this server; the client
      // reconnects to the next one.
      sink_.finish(absl::UnavailableError(
          "the server is shutting down; watch the job again"));
      return true;
    case WaiterSet::Why::kChanged:
      break;
  }
  absl::StatusOr<v1::Job> job = core_->GetJob(job_id_);
  if (!job.ok()) {
    sink_.finish(job.status());
    return true;
  }
  if (job->version() == seen_version_ && last_.has_value() &&
      job->waiting() == last_->waiting()) {
    return false;
  }
  seen_version_ = job->version();
  // Tasks first, then the job: a job read before its tasks could say
  // QUEUED while a task it does not know of yet runs.
  absl::StatusOr<std::vector<v1::Task>> tasks = core_->ListTasks(job_id_);
  if (!tasks.ok()) {
    sink_.finish(tasks.status());
    return true;
  }
  job = core_->GetJob(job_id_);
  if (!job.ok()) {
    sink_.finish(job.status());
    return true;
  }
  v1::JobEvent event = JobEventFor(*job, *tasks);
  if (IsFinal(job->state())) {
    sink_.write_last(event);
    return true;
  }
  // An update that changes nothing a watcher sees (a lease renewed, a
  // settle that found the same state) is not sent again.
  if (last_.has_value() && !ProgressChanged(*last_, event)) return false;
  last_ = event;
  {
    absl::MutexLock lock(&mu_);
    writing_ = true;
  }
  sink_.write(*last_);
  return false;
}

}  // namespace mutwo
