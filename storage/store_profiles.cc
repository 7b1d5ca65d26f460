// The Store's profiles (one per job and batch size) and validations (one
// per job, batch size, budget and round of the closed loop).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {

absl::Status Store::PutProfileLocked(absl::string_view job_id,
                                     int64_t batch_size,
                                     const v1::Profile& profile) {
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(batch_size));
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO profiles (job_id, batch_size, "
                   "graph_fingerprint, profile, updated_unix_ms, device) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (job_id, batch_size) DO UPDATE SET "
                   "graph_fingerprint = excluded.graph_fingerprint, "
                   "profile = excluded.profile, "
                   "updated_unix_ms = excluded.updated_unix_ms, "
                   "device = excluded.device"));
  upsert->BindText(1, job_id);
  upsert->BindInt(2, batch_size);
  upsert->BindText(3, profile.graph_fingerprint());
  upsert->BindBlob(4, profile.SerializeAsString());
  upsert->BindInt(5, NowMs());
  upsert->BindBlob(6, profile.device().SerializeAsString());
  return upsert->Run();
}

absl::StatusOr<v1::Profile> Store::GetProfile(absl::string_view job_id,
                                              int64_t batch_size) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<BlobRow> row,
                         QueryBlob("SELECT profile FROM profiles "
                                   "WHERE job_id = ?1 AND batch_size = ?2",
                                   [&](Stmt& stmt) {
                                     stmt.BindText(1, job_id);
                                     stmt.BindInt(2, batch_size);
                                   }));
  if (!row.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no profile for job ", Quote(job_id), " at batch size ", batch_size));
  }
  return ParseRow<v1::Profile>(
      row->blob,
      absl::StrCat("profile of job ", job_id, " batch ", batch_size));
}

absl::StatusOr<v1::DeviceInfo> Store::GetProfileDevice(absl::string_view job_id,
                                                       int64_t batch_size) {
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<BlobRow> row,
      QueryBlob("SELECT COALESCE(device, profile), device IS NULL "
                "FROM profiles WHERE job_id = ?1 AND batch_size = ?2",
                [&](Stmt& stmt) {
                  stmt.BindText(1, job_id);
                  stmt.BindInt(2, batch_size);
                }));
  if (!row.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no profile for job ", Quote(job_id), " at batch size ", batch_size));
  }
  const std::string what =
      absl::StrCat("profile of job ", job_id, " batch ", batch_size);
  if (row->flag) {  // written by schema version 1: only the whole profile
    MUTWO_ASSIGN_OR_RETURN(v1::Profile profile,
                           ParseRow<v1::Profile>(row->blob, what));
    return profile.device();
  }
  return ParseRow<v1::DeviceInfo>(row->blob, what);
}

absl::Status Store::PutValidationLocked(absl::string_view job_id,
                                        int64_t batch_size,
                                        absl::string_view budget_text,
                                        int round,
                                        const v1::Validation& validation) {
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(batch_size));
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(budget_text, "budget text"));
  if (round < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation round ", round, ": must be >= 1"));
  }
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO validations (job_id, batch_size, budget_text, "
                   "round, validation, updated_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (job_id, batch_size, budget_text, round) DO "
                   "UPDATE SET validation = excluded.validation, "
                   "updated_unix_ms = excluded.updated_unix_ms"));
  upsert->BindText(1, job_id);
  upsert->BindInt(2, batch_size);
  upsert->BindText(3, budget_text);
  upsert->BindInt(4, round);
  upsert->BindBlob(5, validation.SerializeAsString());
  upsert->BindInt(6, NowMs());
  return upsert->Run();
}

absl::StatusOr<std::vector<ValidationRecord>> Store::ListValidations(
    absl::string_view job_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  return QueryRows<ValidationRecord>(
      *db_,
      "SELECT batch_size, budget_text, round, validation "
      "FROM validations WHERE job_id = ?1 ORDER BY batch_size, rowid",
      [&](Stmt& stmt) { stmt.BindText(1, job_id); },
      [&](const Stmt& stmt) -> absl::StatusOr<ValidationRecord> {
        ValidationRecord record;
        record.batch_size = stmt.ColumnInt(0);
        record.budget_text = stmt.ColumnText(1);
        record.round = static_cast<int>(stmt.ColumnInt(2));
        MUTWO_ASSIGN_OR_RETURN(
            record.validation,
            ParseRow<v1::Validation>(
                stmt.ColumnBlob(3),
                absl::StrCat("validation of job ", job_id, " batch ",
                             record.batch_size, " budget ", record.budget_text,
                             " round ", record.round)));
        return record;
      });
}

}  // namespace mutwo::storage
