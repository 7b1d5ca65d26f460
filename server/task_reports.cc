#include "server/task_reports.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace mutwo {
namespace {

// Whether a report for `task` with this key can be taken now (the lease it
// holds, or one that expired with nobody leasing the task since), so that
// planning for it is worth doing.
bool HoldsTask(const v1::Task& task, const ReportKey& key) {
  return task.fence_token() == key.fence_token &&
         task.lease_owner() == key.worker_id &&
         (task.state() == v1::Task::LEASED || task.state() == v1::Task::QUEUED);
}

bool IsRetriedReport(const v1::Task& task, const ReportKey& key) {
  return task.state() == v1::Task::DONE &&
         task.fence_token() == key.fence_token &&
         task.lease_owner() == key.worker_id;
}

}  // namespace

absl::StatusOr<TaskReports::Admission> TaskReports::Admit(
    const v1::Task& task, const ReportKey& key) {
  if (IsRetriedReport(task, key)) return Admission::kRetried;
  if (HoldsTask(task, key)) return Admission::kTake;
  // The store names what is wrong (stale fence, not leased, another
  // worker's lease); nothing is written either way.
  MUTWO_RETURN_IF_ERROR(
      store_->Write([&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(
            bool stored,
            w.CompleteTask(key.task_id, key.fence_token, key.worker_id, ""));
        if (stored) {
          return absl::AbortedError(
              absl::StrCat("task ", key.task_id,
                           " changed while its report was read; "
                           "retry"));
        }
        return absl::OkStatus();
      }));
  return Admission::kRetried;  // a retried report of a completed task
}

absl::Status TaskReports::Write(
    const ReportKey& key, absl::string_view result, bool* retried,
    const std::function<absl::Status(storage::Store::Writer&)>& body) {
  return store_->Write([&](storage::Store::Writer& w) -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(
        bool stored_now,
        w.CompleteTask(key.task_id, key.fence_token, key.worker_id, result));
    if (!stored_now) {
      *retried = true;
      return absl::OkStatus();
    }
    return body(w);
  });
}

absl::Status TaskReports::Refuse(const v1::Task& task, const ReportKey& key,
                                 absl::Status refusal,
                                 std::optional<v1::Job>* settled) {
  if (refusal.ok() || !HoldsTask(task, key)) return refusal;
  // Over a limit, the same model reports the same again; anything else
  // (a malformed profile, the wrong kind of report) may be one worker's
  // fault, and another may do better.
  const bool retryable = !absl::IsResourceExhausted(refusal);
  const std::string reason =
      absl::StrCat("report refused: ", refusal.message());
  absl::Status failed =
      store_->Write([&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(
            v1::Task now,
            w.FailTask(key.task_id, key.fence_token, key.worker_id, reason,
                       retryable, max_attempts_));
        MUTWO_ASSIGN_OR_RETURN(*settled, settle_in_(w, now.job_id()));
        return absl::OkStatus();
      });
  if (!failed.ok()) {
    // The lease moved on meanwhile: whoever holds it now reports.
    settled->reset();
    MUTWO_LOG(warn, "task {}: failing it after a refused report: {}",
              key.task_id, failed.ToString());
  }
  return refusal;
}

}  // namespace mutwo
