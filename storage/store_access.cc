// The Store's identity queries (issue 15): who owns a job, who uploaded a
// model, which principal a worker id is bound to, and whether a principal's
// worker holds a lease on a task of a model. Kept apart from store.cc, which
// holds the aggregates themselves.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/store.h"

namespace mutwo::storage {

absl::StatusOr<std::string> Store::GetJobOwner(absl::string_view job_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt, db_->Prepare("SELECT owner FROM jobs WHERE job_id = ?1"));
  stmt->BindText(1, job_id);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  }
  std::string owner = stmt->ColumnText(0);
  stmt->Reset();
  return owner;
}

absl::Status Store::RecordModelUpload(absl::string_view sha256,
                                      absl::string_view principal) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO model_uploads (sha256, principal, "
                   "created_unix_ms) VALUES (?1, ?2, ?3) "
                   "ON CONFLICT (sha256, principal) DO NOTHING"));
  insert->BindText(1, sha256);
  insert->BindText(2, principal);
  insert->BindInt(3, NowMs());
  return insert->Run();
}

absl::StatusOr<bool> Store::HasUploadedModel(absl::string_view sha256,
                                             absl::string_view principal) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(Stmt * stmt,
                         db_->Prepare("SELECT 1 FROM model_uploads "
                                      "WHERE sha256 = ?1 AND principal = ?2"));
  stmt->BindText(1, sha256);
  stmt->BindText(2, principal);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  stmt->Reset();
  return row;
}

absl::StatusOr<std::string> Store::GetWorkerPrincipal(
    absl::string_view worker_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare("SELECT principal FROM workers WHERE worker_id = ?1"));
  stmt->BindText(1, worker_id);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat(
        "worker \"", worker_id, "\" is not registered; register first"));
  }
  std::string principal = stmt->ColumnText(0);
  stmt->Reset();
  return principal;
}

absl::StatusOr<bool> Store::HoldsLeaseOnModel(absl::string_view principal,
                                              absl::string_view sha256) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare(absl::StrFormat(
          "SELECT 1 FROM tasks t JOIN jobs j ON j.job_id = t.job_id "
          "JOIN workers w ON w.worker_id = t.lease_owner "
          "WHERE t.state = %d AND j.model_sha256 = ?1 AND w.principal = ?2 "
          "LIMIT 1",
          v1::Task::LEASED)));
  stmt->BindText(1, sha256);
  stmt->BindText(2, principal);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  stmt->Reset();
  return row;
}

}  // namespace mutwo::storage
