// The Store's workers: registration (bound to a principal), heartbeats,
// LOST after silence, forgetting; and whether a worker holds a lease on a
// model (what FetchModel needs).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {
namespace {

constexpr char kWorkerColumns[] =
    "worker_id, state, last_heartbeat_unix_ms, current_task_id, info";

absl::StatusOr<v1::WorkerInfo> WorkerFromRow(const Stmt& stmt) {
  const std::string worker_id = stmt.ColumnText(0);
  MUTWO_ASSIGN_OR_RETURN(
      v1::WorkerInfo worker,
      ParseRow<v1::WorkerInfo>(stmt.ColumnBlob(4),
                               absl::StrCat("worker ", worker_id)));
  const int64_t state = stmt.ColumnInt(1);
  if (!v1::WorkerInfo::State_IsValid(static_cast<int>(state))) {
    return absl::DataLossError(absl::StrCat(
        "worker ", worker_id, ": stored state ", state, " is not valid"));
  }
  // The columns are the live state; the blob holds the registration facts.
  worker.set_worker_id(worker_id);
  worker.set_state(static_cast<v1::WorkerInfo::State>(state));
  worker.set_last_heartbeat_unix_ms(stmt.ColumnInt(2));
  worker.set_current_task_id(stmt.ColumnText(3));
  return worker;
}

}  // namespace

absl::StatusOr<std::optional<v1::WorkerInfo>> Store::FindWorker(
    absl::string_view worker_id) {
  return QueryRow<v1::WorkerInfo>(
      *db_,
      absl::StrCat("SELECT ", kWorkerColumns,
                   " FROM workers WHERE worker_id = ?1"),
      [&](Stmt& stmt) { stmt.BindText(1, worker_id); }, WorkerFromRow);
}

absl::StatusOr<v1::WorkerInfo> Store::UpsertWorker(
    const v1::WorkerInfo& worker, absl::string_view principal) {
  if (!v1::WorkerInfo::State_IsValid(worker.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker state ", static_cast<int>(worker.state()), " is not valid"));
  }
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  const int64_t now_ms = NowMs();
  v1::WorkerInfo stored = worker;
  if (stored.worker_id().empty()) {
    stored.set_worker_id(NewId("worker", now_ms));
  } else {
    MUTWO_ASSIGN_OR_RETURN(
        const std::optional<bool> taken,
        QueryRow<bool>(
            *db_, "SELECT principal, state FROM workers WHERE worker_id = ?1",
            [&](Stmt& stmt) { stmt.BindText(1, stored.worker_id()); },
            [&](const Stmt& owner) -> absl::StatusOr<bool> {
              return owner.ColumnText(0) != principal &&
                     owner.ColumnInt(1) != v1::WorkerInfo::LOST &&
                     owner.ColumnInt(1) != v1::WorkerInfo::STOPPED;
            }));
    if (taken.value_or(false)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker id ", Quote(stored.worker_id()),
          " is registered by another principal and still alive; register "
          "without an id to get a new one"));
    }
  }
  if (stored.state() == v1::WorkerInfo::STATE_UNSPECIFIED ||
      stored.state() == v1::WorkerInfo::LOST ||
      stored.state() == v1::WorkerInfo::STOPPED) {
    stored.set_state(v1::WorkerInfo::IDLE);  // registering means alive
  }
  stored.set_last_heartbeat_unix_ms(now_ms);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO workers (worker_id, state, "
                   "last_heartbeat_unix_ms, current_task_id, info, principal) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (worker_id) DO UPDATE SET "
                   "state = excluded.state, "
                   "last_heartbeat_unix_ms = excluded.last_heartbeat_unix_ms, "
                   "current_task_id = excluded.current_task_id, "
                   "info = excluded.info, principal = excluded.principal"));
  upsert->BindText(1, stored.worker_id());
  upsert->BindInt(2, stored.state());
  upsert->BindInt(3, now_ms);
  upsert->BindText(4, stored.current_task_id());
  upsert->BindBlob(5, stored.SerializeAsString());
  upsert->BindText(6, principal);
  MUTWO_RETURN_IF_ERROR(upsert->Run());
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::Status Store::TouchWorker(absl::string_view worker_id,
                                v1::WorkerInfo::State state,
                                absl::string_view current_task_id) {
  if (!v1::WorkerInfo::State_IsValid(state) ||
      state == v1::WorkerInfo::STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, ": invalid state ", static_cast<int>(state)));
  }
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update,
      db_->Prepare("UPDATE workers SET state = ?2, last_heartbeat_unix_ms = "
                   "?3, current_task_id = ?4 WHERE worker_id = ?1"));
  update->BindText(1, worker_id);
  update->BindInt(2, state);
  update->BindInt(3, NowMs());
  update->BindText(4, current_task_id);
  MUTWO_RETURN_IF_ERROR(update->Run());
  if (db_->Changes() == 0) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", Quote(worker_id), " is not registered; register first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::WorkerInfo> Store::GetWorker(absl::string_view worker_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::WorkerInfo> worker,
                         FindWorker(worker_id));
  if (!worker.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", Quote(worker_id), " is not registered; register first"));
  }
  return *std::move(worker);
}

absl::StatusOr<int64_t> Store::DeleteForgottenWorkers(int64_t older_than_ms) {
  if (older_than_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("older_than_ms must be positive, got ", older_than_ms));
  }
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(Stmt * del,
                         db_->Prepare(absl::StrFormat(
                             "DELETE FROM workers WHERE state IN (%d, %d) AND "
                             "last_heartbeat_unix_ms < ?1",
                             v1::WorkerInfo::LOST, v1::WorkerInfo::STOPPED)));
  del->BindInt(1, NowMs() - older_than_ms);
  MUTWO_RETURN_IF_ERROR(del->Run());  // one statement: atomic
  return db_->Changes();
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Store::ListWorkers() {
  absl::MutexLock lock(&mutex_);
  return QueryRows<v1::WorkerInfo>(
      *db_,
      absl::StrCat("SELECT ", kWorkerColumns,
                   " FROM workers ORDER BY worker_id"),
      nullptr, WorkerFromRow);
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Store::MarkLostWorkers(
    int64_t older_than_ms) {
  if (older_than_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("older_than_ms must be positive, got ", older_than_ms));
  }
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  const int64_t cutoff_ms = NowMs() - older_than_ms;
  MUTWO_ASSIGN_OR_RETURN(
      std::vector<v1::WorkerInfo> lost,
      QueryRows<v1::WorkerInfo>(
          *db_,
          absl::StrFormat("SELECT %s FROM workers WHERE state NOT IN (%d, %d) "
                          "AND last_heartbeat_unix_ms < ?1 ORDER BY worker_id",
                          kWorkerColumns, v1::WorkerInfo::LOST,
                          v1::WorkerInfo::STOPPED),
          [&](Stmt& stmt) { stmt.BindInt(1, cutoff_ms); }, WorkerFromRow));
  for (v1::WorkerInfo& worker : lost) {
    worker.set_state(v1::WorkerInfo::LOST);
  }
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update, db_->Prepare(absl::StrFormat(
                         "UPDATE workers SET state = %d WHERE worker_id = ?1",
                         v1::WorkerInfo::LOST)));
  for (const v1::WorkerInfo& worker : lost) {
    update->Reset();
    update->BindText(1, worker.worker_id());
    MUTWO_RETURN_IF_ERROR(update->Run());
  }
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return lost;
}

absl::StatusOr<std::string> Store::GetWorkerPrincipal(
    absl::string_view worker_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<std::string> principal,
      QueryRow<std::string>(
          *db_, "SELECT principal FROM workers WHERE worker_id = ?1",
          [&](Stmt& stmt) { stmt.BindText(1, worker_id); },
          [](const Stmt& stmt) -> absl::StatusOr<std::string> {
            return stmt.ColumnText(0);
          }));
  if (!principal.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "worker \"", worker_id, "\" is not registered; register first"));
  }
  return *std::move(principal);
}

absl::StatusOr<bool> Store::HoldsLeaseOnModel(absl::string_view principal,
                                              absl::string_view sha256) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      const std::optional<bool> row,
      QueryRow<bool>(
          *db_,
          absl::StrFormat(
              "SELECT 1 FROM tasks t JOIN jobs j ON j.job_id = t.job_id "
              "JOIN workers w ON w.worker_id = t.lease_owner "
              "WHERE t.state = %d AND j.model_sha256 = ?1 AND "
              "w.principal = ?2 LIMIT 1",
              v1::Task::LEASED),
          [&](Stmt& stmt) {
            stmt.BindText(1, sha256);
            stmt.BindText(2, principal);
          },
          [](const Stmt&) -> absl::StatusOr<bool> { return true; }));
  return row.has_value();
}

}  // namespace mutwo::storage
