// The Store's profile measurements: who measured each stored profile, its
// digest and peak, and whether it disagrees with another measurement of the
// same key (store.h, ProfileMeasurement).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {
namespace {

constexpr char kColumns[] =
    "job_id, batch_size, measurement_key, profile_sha256, worker_id, "
    "worker_principal, tenant, peak_bytes, flag, created_unix_ms";

absl::StatusOr<ProfileMeasurement> ReadMeasurement(const Stmt& stmt) {
  ProfileMeasurement m;
  m.job_id = stmt.ColumnText(0);
  m.batch_size = stmt.ColumnInt(1);
  m.measurement_key = stmt.ColumnText(2);
  m.profile_sha256 = stmt.ColumnText(3);
  m.worker_id = stmt.ColumnText(4);
  m.worker_principal = stmt.ColumnText(5);
  m.tenant = stmt.ColumnText(6);
  m.peak_bytes = stmt.ColumnInt(7);
  m.flag = stmt.ColumnText(8);
  m.created_unix_ms = stmt.ColumnInt(9);
  return m;
}

}  // namespace

absl::Status Store::PutProfileMeasurementLocked(const ProfileMeasurement& m) {
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(m.batch_size));
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(m.measurement_key, "measurement key"));
  MUTWO_RETURN_IF_ERROR(ValidateSha256(m.profile_sha256));
  MUTWO_RETURN_IF_ERROR(RequireJob(m.job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare(absl::StrCat(
          "INSERT INTO profile_measurements (", kColumns,
          ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
          "ON CONFLICT (job_id, batch_size) DO UPDATE SET "
          "measurement_key = excluded.measurement_key, "
          "profile_sha256 = excluded.profile_sha256, "
          "worker_id = excluded.worker_id, "
          "worker_principal = excluded.worker_principal, "
          "tenant = excluded.tenant, peak_bytes = excluded.peak_bytes, "
          "flag = excluded.flag, created_unix_ms = excluded.created_unix_ms")));
  upsert->BindText(1, m.job_id);
  upsert->BindInt(2, m.batch_size);
  upsert->BindText(3, m.measurement_key);
  upsert->BindText(4, m.profile_sha256);
  upsert->BindText(5, m.worker_id);
  upsert->BindText(6, m.worker_principal);
  upsert->BindText(7, m.tenant);
  upsert->BindInt(8, m.peak_bytes);
  upsert->BindText(9, m.flag);
  upsert->BindInt(10, NowMs());
  return upsert->Run();
}

absl::StatusOr<std::vector<ProfileMeasurement>>
Store::ListProfileMeasurementsLocked(absl::string_view measurement_key,
                                     absl::string_view job_id,
                                     int64_t batch_size) {
  if (!job_id.empty()) {
    return QueryRows<ProfileMeasurement>(
        *db_,
        absl::StrCat("SELECT ", kColumns,
                     " FROM profile_measurements "
                     "WHERE job_id = ?1 AND batch_size = ?2"),
        [&](Stmt& stmt) {
          stmt.BindText(1, job_id);
          stmt.BindInt(2, batch_size);
        },
        ReadMeasurement);
  }
  return QueryRows<ProfileMeasurement>(
      *db_,
      absl::StrCat("SELECT ", kColumns,
                   " FROM profile_measurements WHERE measurement_key = ?1 "
                   "ORDER BY rowid"),
      [&](Stmt& stmt) { stmt.BindText(1, measurement_key); }, ReadMeasurement);
}

absl::StatusOr<std::optional<ProfileMeasurement>> Store::GetProfileMeasurement(
    absl::string_view job_id, int64_t batch_size) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::vector<ProfileMeasurement> rows,
                         ListProfileMeasurementsLocked("", job_id, batch_size));
  if (rows.empty()) return std::nullopt;
  return rows.front();
}

}  // namespace mutwo::storage
