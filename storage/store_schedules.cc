// The Store's schedule cache: schedules by their canonical cache key
// (schedule_key.h).
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {

absl::StatusOr<std::optional<v1::Schedule>> Store::GetCachedSchedule(
    const ScheduleCacheKey& key) {
  MUTWO_RETURN_IF_ERROR(ValidateScheduleCacheKey(key));
  const std::string cache_key = CanonicalKeyString(key);
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<BlobRow> row,
      QueryBlob("SELECT schedule FROM schedules WHERE cache_key = ?1",
                [&](Stmt& stmt) { stmt.BindText(1, cache_key); }));
  if (!row.has_value()) {
    return std::nullopt;
  }
  MUTWO_ASSIGN_OR_RETURN(
      v1::Schedule schedule,
      ParseRow<v1::Schedule>(row->blob,
                             absl::StrCat("cached schedule ", cache_key)));
  return schedule;
}

absl::Status Store::PutSchedule(const ScheduleCacheKey& key,
                                absl::string_view job_id,
                                const v1::Schedule& schedule) {
  MUTWO_RETURN_IF_ERROR(ValidateScheduleCacheKey(key));
  const std::string cache_key = CanonicalKeyString(key);
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare(
          "INSERT INTO schedules (cache_key, model_sha256, "
          "batch_size, job_id, schedule, created_unix_ms, profile_sha256, "
          "measured_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) "
          "ON CONFLICT (cache_key) DO UPDATE SET "
          "job_id = excluded.job_id, schedule = excluded.schedule, "
          "created_unix_ms = excluded.created_unix_ms, "
          "profile_sha256 = excluded.profile_sha256, "
          "measured_by = excluded.measured_by"));
  upsert->BindText(1, cache_key);
  upsert->BindText(2, key.model_sha256);
  upsert->BindInt(3, key.batch_size);
  upsert->BindText(4, job_id);
  upsert->BindBlob(5, schedule.SerializeAsString());
  upsert->BindInt(6, NowMs());
  upsert->BindText(7, key.profile_sha256);
  upsert->BindText(8, key.measured_by);
  return upsert->Run();  // one statement: atomic without BEGIN
}

}  // namespace mutwo::storage
