// The Store's tasks: add, lease with fence tokens, heartbeat, complete
// (one result per task), fail (retry or dead letter), re-queue expired
// leases, cancel, list and count.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {
namespace {

constexpr char kTaskColumns[] =
    "task_id, job_id, kind, state, batch_size, attempt, fence_token, "
    "lease_owner, lease_expiry_unix_ms, last_error, schedule";

absl::StatusOr<v1::Task> TaskFromRow(const Stmt& stmt) {
  v1::Task task;
  task.set_task_id(stmt.ColumnText(0));
  task.set_job_id(stmt.ColumnText(1));
  const int64_t kind = stmt.ColumnInt(2);
  const int64_t state = stmt.ColumnInt(3);
  if (!v1::Task::Kind_IsValid(static_cast<int>(kind)) ||
      !v1::Task::State_IsValid(static_cast<int>(state))) {
    return absl::DataLossError(
        absl::StrCat("task ", task.task_id(), ": stored kind ", kind,
                     " or state ", state, " is not a valid value"));
  }
  task.set_kind(static_cast<v1::Task::Kind>(kind));
  task.set_state(static_cast<v1::Task::State>(state));
  task.set_batch_size(stmt.ColumnInt(4));
  task.set_attempt(static_cast<int32_t>(stmt.ColumnInt(5)));
  task.set_fence_token(stmt.ColumnInt(6));
  task.set_lease_owner(stmt.ColumnText(7));
  task.set_lease_expiry_unix_ms(stmt.ColumnInt(8));
  task.set_last_error(stmt.ColumnText(9));
  if (!stmt.ColumnIsNull(10)) {
    MUTWO_ASSIGN_OR_RETURN(
        *task.mutable_schedule(),
        ParseRow<v1::Schedule>(stmt.ColumnBlob(10),
                               absl::StrCat("task ", task.task_id())));
  }
  return task;
}

absl::Status ValidateLeaseMs(int64_t lease_ms) {
  if (lease_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ms must be positive, got ", lease_ms));
  }
  return absl::OkStatus();
}

absl::Status ValidateMaxAttempts(int max_attempts) {
  if (max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts must be at least 1, got ", max_attempts));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<v1::Task>> Store::FindTask(
    absl::string_view task_id) {
  return QueryRow<v1::Task>(
      *db_,
      absl::StrCat("SELECT ", kTaskColumns, " FROM tasks WHERE task_id = ?1"),
      [&](Stmt& stmt) { stmt.BindText(1, task_id); }, TaskFromRow);
}

absl::StatusOr<v1::Task> Store::RequireLease(absl::string_view task_id,
                                             int64_t fence_token,
                                             absl::string_view worker_id,
                                             absl::string_view action) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> task, FindTask(task_id));
  if (!task.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("task ", Quote(task_id), " not found"));
  }
  if (task->fence_token() != fence_token) {
    return absl::FailedPreconditionError(
        absl::StrCat(action, " task ", task_id, ": stale fence token ",
                     fence_token, " (current ", task->fence_token(), ", state ",
                     v1::Task::State_Name(task->state()),
                     "); the lease was lost, drop this attempt"));
  }
  if (task->state() != v1::Task::LEASED) {
    return absl::FailedPreconditionError(
        absl::StrCat(action, " task ", task_id, ": the task is ",
                     v1::Task::State_Name(task->state()), ", not LEASED"));
  }
  if (task->lease_owner() != worker_id) {
    return absl::PermissionDeniedError(
        absl::StrCat(action, " task ", task_id, ": worker ", Quote(worker_id),
                     " does not hold its lease"));
  }
  return *std::move(task);
}

absl::Status Store::WriteTaskState(const v1::Task& task, int64_t now_ms) {
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update, db_->Prepare("UPDATE tasks SET state = ?2, attempt = ?3, "
                                  "fence_token = ?4, lease_owner = ?5, "
                                  "lease_expiry_unix_ms = ?6, last_error = ?7, "
                                  "updated_unix_ms = ?8 WHERE task_id = ?1"));
  update->BindText(1, task.task_id());
  update->BindInt(2, task.state());
  update->BindInt(3, task.attempt());
  update->BindInt(4, task.fence_token());
  update->BindText(5, task.lease_owner());
  update->BindInt(6, task.lease_expiry_unix_ms());
  update->BindText(7, task.last_error());
  update->BindInt(8, now_ms);
  return update->Run();
}

absl::StatusOr<v1::Task> Store::AddTaskLocked(
    absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
    const std::optional<v1::Schedule>& schedule) {
  if (kind != v1::Task::PROFILE && kind != v1::Task::VALIDATE &&
      kind != v1::Task::MAX_BATCH) {
    return absl::InvalidArgumentError(
        absl::StrCat("task kind must be PROFILE, VALIDATE or MAX_BATCH, got ",
                     static_cast<int>(kind)));
  }
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(batch_size));
  if (kind != v1::Task::PROFILE && !schedule.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(v1::Task::Kind_Name(kind), " task for job ", job_id,
                     " needs the schedule to execute"));
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, RequireJob(job_id));
  if (IsFinished(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::Job::State_Name(job.state()),
                     "; no new tasks"));
  }
  const int64_t now_ms = NowMs();
  v1::Task task;
  task.set_task_id(NewId("task", now_ms));
  task.set_job_id(std::string(job_id));
  task.set_kind(kind);
  task.set_state(v1::Task::QUEUED);
  task.set_batch_size(batch_size);
  task.set_attempt(1);
  if (schedule.has_value()) {
    *task.mutable_schedule() = *schedule;
  }
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO tasks (task_id, job_id, kind, state, "
                   "batch_size, device_kind, attempt, schedule, "
                   "created_unix_ms, updated_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)"));
  insert->BindText(1, task.task_id());
  insert->BindText(2, task.job_id());
  insert->BindInt(3, task.kind());
  insert->BindInt(4, task.state());
  insert->BindInt(5, batch_size);
  insert->BindText(6, absl::AsciiStrToLower(job.spec().device_kind()));
  insert->BindInt(7, task.attempt());
  if (schedule.has_value()) {
    insert->BindBlob(8, schedule->SerializeAsString());
  } else {
    insert->BindNull(8);
  }
  insert->BindInt(9, now_ms);
  MUTWO_RETURN_IF_ERROR(insert->Run());
  return task;
}

absl::StatusOr<std::optional<v1::Task>> Store::LeaseTask(
    absl::string_view worker_id, absl::string_view device_kind,
    int64_t lease_ms) {
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(worker_id, "worker id"));
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(device_kind, "device kind"));
  MUTWO_RETURN_IF_ERROR(ValidateLeaseMs(lease_ms));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(
      const std::optional<std::string> picked,
      QueryRow<std::string>(
          *db_,
          absl::StrFormat(
              "SELECT t.task_id FROM tasks t JOIN jobs j ON j.job_id = "
              "t.job_id WHERE t.state = %d AND j.state NOT IN (%d, %d, %d) "
              "AND (t.device_kind = '' OR t.device_kind = ?1) "
              "ORDER BY t.seq LIMIT 1",
              v1::Task::QUEUED, v1::Job::SUCCEEDED, v1::Job::FAILED,
              v1::Job::CANCELLED),
          [&](Stmt& stmt) {
            stmt.BindText(1, absl::AsciiStrToLower(device_kind));
          },
          [](const Stmt& stmt) -> absl::StatusOr<std::string> {
            return stmt.ColumnText(0);
          }));
  if (!picked.has_value()) {
    return std::nullopt;
  }
  const std::string& task_id = *picked;

  MUTWO_ASSIGN_OR_RETURN(
      Stmt * fence, db_->Prepare("UPDATE meta SET value = value + 1 "
                                 "WHERE key = 'fence_token' RETURNING value"));
  MUTWO_ASSIGN_OR_RETURN(bool fence_row, fence->Step());
  if (!fence_row) {
    return absl::DataLossError("meta table lost its fence_token row");
  }
  const int64_t fence_token = fence->ColumnInt(0);
  MUTWO_RETURN_IF_ERROR(fence->Run());

  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> task, FindTask(task_id));
  if (!task.has_value()) {
    return absl::InternalError(
        absl::StrCat("task ", task_id, " vanished inside its transaction"));
  }
  const int64_t now_ms = NowMs();
  task->set_state(v1::Task::LEASED);
  task->set_fence_token(fence_token);
  task->set_lease_owner(std::string(worker_id));
  task->set_lease_expiry_unix_ms(now_ms + lease_ms);
  MUTWO_RETURN_IF_ERROR(WriteTaskState(*task, now_ms));
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return task;
}

absl::Status Store::ReleaseLease(absl::string_view task_id, int64_t fence_token,
                                 absl::string_view worker_id) {
  return InTransaction([&]() -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(v1::Task task, RequireLease(task_id, fence_token,
                                                       worker_id, "release"));
    task.set_state(v1::Task::QUEUED);
    task.set_lease_owner("");
    task.set_lease_expiry_unix_ms(0);
    return WriteTaskState(task, NowMs());
  });
}

absl::StatusOr<v1::Task> Store::ExtendLease(absl::string_view task_id,
                                            int64_t fence_token,
                                            absl::string_view worker_id,
                                            int64_t lease_ms) {
  MUTWO_RETURN_IF_ERROR(ValidateLeaseMs(lease_ms));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(
      v1::Task task,
      RequireLease(task_id, fence_token, worker_id, "heartbeat for"));
  const int64_t now_ms = NowMs();
  task.set_lease_expiry_unix_ms(now_ms + lease_ms);
  MUTWO_RETURN_IF_ERROR(WriteTaskState(task, now_ms));
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return task;
}

absl::StatusOr<bool> Store::CompleteTaskLocked(absl::string_view task_id,
                                               int64_t fence_token,
                                               absl::string_view worker_id,
                                               absl::string_view result) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> current, FindTask(task_id));
  const bool same_attempt = current.has_value() &&
                            current->fence_token() == fence_token &&
                            current->lease_owner() == worker_id;
  if (same_attempt && current->state() == v1::Task::DONE) {
    return false;  // the same attempt reporting again
  }
  v1::Task task;
  if (same_attempt && current->state() == v1::Task::QUEUED &&
      !worker_id.empty()) {
    // The lease expired and the task was re-queued, but nobody leased it
    // since (a new lease draws a new fence): the result is still the latest
    // work on it, so take it rather than run the task again.
    task = *std::move(current);
  } else {
    MUTWO_ASSIGN_OR_RETURN(
        task, RequireLease(task_id, fence_token, worker_id, "complete"));
  }
  const int64_t now_ms = NowMs();
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO task_results (task_id, fence_token, result, "
                   "stored_unix_ms) VALUES (?1, ?2, ?3, ?4)"));
  insert->BindText(1, task_id);
  insert->BindInt(2, fence_token);
  insert->BindBlob(3, result);
  insert->BindInt(4, now_ms);
  MUTWO_RETURN_IF_ERROR(insert->Run());
  task.set_state(v1::Task::DONE);
  task.set_lease_expiry_unix_ms(0);
  MUTWO_RETURN_IF_ERROR(WriteTaskState(task, now_ms));
  return true;
}

absl::StatusOr<v1::Task> Store::FailTaskLocked(
    absl::string_view task_id, int64_t fence_token, absl::string_view worker_id,
    absl::string_view reason, bool retryable, int max_attempts) {
  MUTWO_RETURN_IF_ERROR(ValidateMaxAttempts(max_attempts));
  MUTWO_ASSIGN_OR_RETURN(v1::Task task,
                         RequireLease(task_id, fence_token, worker_id, "fail"));
  task.set_last_error(std::string(reason));
  task.set_lease_owner("");
  task.set_lease_expiry_unix_ms(0);
  if (retryable && task.attempt() < max_attempts) {
    task.set_state(v1::Task::QUEUED);
    task.set_attempt(task.attempt() + 1);
  } else {
    task.set_state(v1::Task::FAILED);
  }
  MUTWO_RETURN_IF_ERROR(WriteTaskState(task, NowMs()));
  return task;
}

absl::StatusOr<std::vector<v1::Task>> Store::RequeueExpiredLeases(
    int max_attempts) {
  MUTWO_RETURN_IF_ERROR(ValidateMaxAttempts(max_attempts));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  const int64_t now_ms = NowMs();
  MUTWO_ASSIGN_OR_RETURN(
      std::vector<v1::Task> expired,
      QueryRows<v1::Task>(
          *db_,
          absl::StrFormat("SELECT %s FROM tasks WHERE state = %d "
                          "AND lease_expiry_unix_ms <= ?1 ORDER BY seq",
                          kTaskColumns, v1::Task::LEASED),
          [&](Stmt& stmt) { stmt.BindInt(1, now_ms); }, TaskFromRow));
  for (v1::Task& task : expired) {
    const std::string owner = task.lease_owner();
    if (task.attempt() < max_attempts) {
      task.set_state(v1::Task::QUEUED);
      task.set_last_error(absl::StrCat("lease expired (worker ", owner, ")"));
      task.set_attempt(task.attempt() + 1);
    } else {
      task.set_state(v1::Task::FAILED);
      task.set_last_error(absl::StrCat("lease expired (worker ", owner,
                                       ") on attempt ", task.attempt(), " of ",
                                       max_attempts));
    }
    // The owner and the fence stay until the next lease: a result the
    // owner reports before that is still taken (CompleteTask).
    task.set_lease_expiry_unix_ms(0);
    MUTWO_RETURN_IF_ERROR(WriteTaskState(task, now_ms));
  }
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return expired;
}

absl::StatusOr<v1::Task> Store::GetTaskLocked(absl::string_view task_id) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> task, FindTask(task_id));
  if (!task.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("task ", Quote(task_id), " not found"));
  }
  return *std::move(task);
}

absl::StatusOr<std::string> Store::GetTaskResult(absl::string_view task_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<std::string> result,
      QueryRow<std::string>(
          *db_, "SELECT result FROM task_results WHERE task_id = ?1",
          [&](Stmt& stmt) { stmt.BindText(1, task_id); },
          [](const Stmt& stmt) -> absl::StatusOr<std::string> {
            return stmt.ColumnBlob(0);
          }));
  if (!result.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("no result stored for task ", Quote(task_id)));
  }
  return *std::move(result);
}

absl::StatusOr<std::vector<v1::Task>> Store::ListTasksLocked(
    absl::string_view job_id) {
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  return QueryRows<v1::Task>(
      *db_,
      absl::StrCat("SELECT ", kTaskColumns,
                   " FROM tasks WHERE job_id = ?1 ORDER BY seq"),
      [&](Stmt& stmt) { stmt.BindText(1, job_id); }, TaskFromRow);
}

absl::StatusOr<std::map<v1::Task::State, int64_t>> Store::CountTasksByState() {
  MUTWO_ASSIGN_OR_RETURN(auto rows, CountStates("tasks"));
  return StateCounts<v1::Task::State>(rows, "tasks", v1::Task::State_IsValid,
                                      v1::Task::State_MIN, v1::Task::State_MAX);
}

absl::StatusOr<std::map<std::string, int64_t>>
Store::CountJobsWithQueuedTasksByDeviceKind() {
  absl::MutexLock lock(&mutex_);
  std::map<std::string, int64_t> counts;
  MUTWO_RETURN_IF_ERROR(db_->ForEachRow(
      absl::StrFormat(
          "SELECT t.device_kind, COUNT(DISTINCT t.job_id) FROM tasks t "
          "JOIN jobs j ON j.job_id = t.job_id "
          "WHERE t.state = %d AND j.state NOT IN (%d, %d, %d) "
          "GROUP BY t.device_kind",
          v1::Task::QUEUED, v1::Job::SUCCEEDED, v1::Job::FAILED,
          v1::Job::CANCELLED),
      nullptr, [&](const Stmt& stmt) -> absl::StatusOr<bool> {
        counts[stmt.ColumnText(0)] = stmt.ColumnInt(1);
        return true;
      }));
  return counts;
}

absl::StatusOr<int64_t> Store::CancelJobTasksLocked(absl::string_view job_id) {
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update,
      db_->Prepare(absl::StrFormat(
          "UPDATE tasks SET state = %d, lease_expiry_unix_ms = 0, "
          "updated_unix_ms = ?2 WHERE job_id = ?1 AND state IN (%d, %d)",
          v1::Task::CANCELLED, v1::Task::QUEUED, v1::Task::LEASED)));
  update->BindText(1, job_id);
  update->BindInt(2, NowMs());
  MUTWO_RETURN_IF_ERROR(update->Run());
  return db_->Changes();
}

}  // namespace mutwo::storage
