// The Store's models: content-addressed files under <data_dir>/models,
// their rows, and who uploaded them.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/durable_file.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {

absl::StatusOr<std::string> Store::ModelPath(absl::string_view sha256) const {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  return absl::StrCat(options_.data_dir, "/", kModelsDir, "/", sha256, ".pt");
}

absl::StatusOr<std::optional<ModelInfo>> Store::FindModel(
    absl::string_view sha256) {
  MUTWO_ASSIGN_OR_RETURN(const std::string path, ModelPath(sha256));
  return QueryRow<ModelInfo>(
      *db_,
      "SELECT name, size_bytes, created_unix_ms FROM models WHERE sha256 = ?1",
      [&](Stmt& stmt) { stmt.BindText(1, sha256); },
      [&](const Stmt& stmt) -> absl::StatusOr<ModelInfo> {
        ModelInfo info;
        info.sha256 = std::string(sha256);
        info.name = stmt.ColumnText(0);
        info.size_bytes = stmt.ColumnInt(1);
        info.created_unix_ms = stmt.ColumnInt(2);
        info.path = path;
        return info;
      });
}

absl::StatusOr<std::unique_ptr<TempFile>> Store::NewModelFile() {
  return TempFile::Create(absl::StrCat(options_.data_dir, "/", kModelsDir),
                          "upload");
}

absl::StatusOr<PutModelResult> Store::PutModel(absl::string_view sha256,
                                               absl::string_view name,
                                               int64_t size_bytes,
                                               absl::string_view bytes) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  if (size_bytes != static_cast<int64_t>(bytes.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", sha256, ": declared size ", size_bytes,
        " bytes but received ", bytes.size(), " bytes; nothing stored"));
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<PutModelResult> stored,
                         StoredModel(sha256));
  if (stored.has_value()) return *std::move(stored);
  // The file write (fsyncs included) runs without the lock, so other calls
  // are not held up by a large upload; rename makes it atomic.
  MUTWO_ASSIGN_OR_RETURN(std::unique_ptr<TempFile> file, NewModelFile());
  MUTWO_RETURN_IF_ERROR(file->Append(bytes));
  return PutModelFile(sha256, name, size_bytes, *file);
}

absl::StatusOr<std::optional<PutModelResult>> Store::StoredModel(
    absl::string_view sha256) {
  MUTWO_ASSIGN_OR_RETURN(const std::string path, ModelPath(sha256));
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> existing, FindModel(sha256));
  if (existing.has_value()) {
    absl::StatusOr<int64_t> on_disk = FileSize(path);
    if (on_disk.ok() && *on_disk == existing->size_bytes) {
      return PutModelResult{*std::move(existing), true};
    }
    // The row outlived its file (deleted by hand): write the file again.
  }
  return std::nullopt;
}

absl::StatusOr<PutModelResult> Store::PutModelFile(absl::string_view sha256,
                                                   absl::string_view name,
                                                   int64_t size_bytes,
                                                   TempFile& file) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  if (size_bytes != file.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", sha256, ": declared size ", size_bytes,
        " bytes but received ", file.size(), " bytes; nothing stored"));
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<PutModelResult> stored,
                         StoredModel(sha256));
  if (stored.has_value()) return *std::move(stored);  // `file` is dropped
  MUTWO_RETURN_IF_ERROR(file.Commit(absl::StrCat(sha256, ".pt")));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO models (sha256, name, size_bytes, "
                   "created_unix_ms) VALUES (?1, ?2, ?3, ?4) "
                   "ON CONFLICT (sha256) DO NOTHING"));
  insert->BindText(1, sha256);
  insert->BindText(2, name);
  insert->BindInt(3, size_bytes);
  insert->BindInt(4, NowMs());
  MUTWO_RETURN_IF_ERROR(insert->Run());
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> info, FindModel(sha256));
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  if (!info.has_value()) {
    return absl::InternalError(
        absl::StrCat("model ", sha256, ": row missing after insert"));
  }
  // The bytes were written by this call (a new model, or a row whose file
  // had gone missing), so they were not "already stored".
  return PutModelResult{*std::move(info), false};
}

absl::StatusOr<bool> Store::HasModel(absl::string_view sha256) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> info, FindModel(sha256));
  if (!info.has_value()) {
    return false;
  }
  absl::StatusOr<int64_t> on_disk = FileSize(info->path);
  return on_disk.ok() && *on_disk == info->size_bytes;
}

absl::StatusOr<ModelInfo> Store::GetModelInfo(absl::string_view sha256) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> info, FindModel(sha256));
  if (!info.has_value()) {
    return absl::NotFoundError(absl::StrCat("model ", sha256, " not stored"));
  }
  return *std::move(info);
}

absl::StatusOr<int64_t> Store::TotalModelBytes() {
  absl::MutexLock lock(&mutex_);
  return db_->QueryInt("SELECT COALESCE(SUM(size_bytes), 0) FROM models");
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

absl::StatusOr<int64_t> Store::ModelBytesUploadedBy(
    absl::string_view principal) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      const std::optional<int64_t> row,
      QueryRow<int64_t>(
          *db_,
          "SELECT COALESCE(SUM(m.size_bytes), 0) FROM model_uploads u "
          "JOIN models m ON m.sha256 = u.sha256 WHERE u.principal = ?1",
          [&](Stmt& stmt) { stmt.BindText(1, principal); },
          [](const Stmt& stmt) -> absl::StatusOr<int64_t> {
            return stmt.ColumnInt(0);
          }));
  return row.value_or(0);
}

absl::StatusOr<bool> Store::HasUploadedModel(absl::string_view sha256,
                                             absl::string_view principal) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      const std::optional<bool> row,
      QueryRow<bool>(
          *db_,
          "SELECT 1 FROM model_uploads WHERE sha256 = ?1 AND principal = ?2",
          [&](Stmt& stmt) {
            stmt.BindText(1, sha256);
            stmt.BindText(2, principal);
          },
          [](const Stmt&) -> absl::StatusOr<bool> { return true; }));
  return row.has_value();
}

}  // namespace mutwo::storage
