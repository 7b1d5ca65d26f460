#include "storage/sqlite.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mutwo::storage {

absl::Status SqliteStatus(int code, absl::string_view what,
                          absl::string_view detail) {
  const std::string message =
      absl::StrCat("sqlite: ", what, ": ", detail.empty() ? "" : detail,
                   detail.empty() ? "" : " ", "(", sqlite3_errstr(code), ")");
  switch (code & 0xff) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
      return absl::OkStatus();
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(absl::StrCat(
          message,
          "; another connection held the database lock longer than "
          "the busy timeout"));
    case SQLITE_CONSTRAINT:
      if (code == SQLITE_CONSTRAINT_UNIQUE ||
          code == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return absl::AlreadyExistsError(message);
      }
      return absl::FailedPreconditionError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(message);
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
      return absl::PermissionDeniedError(message);
    case SQLITE_TOOBIG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

Stmt::Stmt(Db* db, sqlite3_stmt* stmt, std::string sql)
    : db_(db), stmt_(stmt), sql_(std::move(sql)) {}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

void Stmt::BindInt(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
}

void Stmt::BindText(int index, absl::string_view value) {
  sqlite3_bind_text64(stmt_, index, value.data(), value.size(),
                      SQLITE_TRANSIENT, SQLITE_UTF8);
}

void Stmt::BindBlob(int index, absl::string_view value) {
  // A null data pointer would bind NULL; an empty blob must stay a blob.
  static const char kEmpty = 0;
  sqlite3_bind_blob64(stmt_, index, value.empty() ? &kEmpty : value.data(),
                      value.size(), SQLITE_TRANSIENT);
}

void Stmt::BindNull(int index) { sqlite3_bind_null(stmt_, index); }

absl::StatusOr<bool> Stmt::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) {
    return true;
  }
  if (rc == SQLITE_DONE) {
    return false;
  }
  absl::Status status = db_->LastError(rc, sql_);
  sqlite3_reset(stmt_);
  return status;
}

absl::Status Stmt::Run() {
  absl::StatusOr<bool> row = Step();
  while (row.ok() && *row) {
    row = Step();
  }
  Reset();
  return row.status();
}

int64_t Stmt::ColumnInt(int column) const {
  return sqlite3_column_int64(stmt_, column);
}

std::string Stmt::ColumnText(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) {
    return "";
  }
  return std::string(reinterpret_cast<const char*>(text),
                     sqlite3_column_bytes(stmt_, column));
}

std::string Stmt::ColumnBlob(int column) const {
  const void* blob = sqlite3_column_blob(stmt_, column);
  if (blob == nullptr) {
    return "";
  }
  return std::string(static_cast<const char*>(blob),
                     sqlite3_column_bytes(stmt_, column));
}

bool Stmt::ColumnIsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

int Stmt::ColumnCount() const { return sqlite3_column_count(stmt_); }

void Stmt::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

absl::StatusOr<std::unique_ptr<Db>> Db::Open(const std::string& path,
                                             int busy_timeout_ms) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status =
        SqliteStatus(rc, absl::StrCat("open ", path),
                     raw != nullptr ? sqlite3_errmsg(raw) : "");
    sqlite3_close(raw);
    return status;
  }
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, busy_timeout_ms);
  return std::unique_ptr<Db>(new Db(raw, path));
}

Db::~Db() {
  statements_.clear();  // finalize before close
  sqlite3_close(db_);
}

absl::Status Db::LastError(int code, absl::string_view what) const {
  return SqliteStatus(code, absl::StrCat(path_, ": ", what),
                      sqlite3_errmsg(db_));
}

absl::Status Db::Exec(absl::string_view sql) {
  const std::string text(sql);
  char* error = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &error);
  if (rc == SQLITE_OK) {
    return absl::OkStatus();
  }
  absl::Status status = SqliteStatus(rc, absl::StrCat(path_, ": ", text),
                                     error != nullptr ? error : "");
  sqlite3_free(error);
  return status;
}

absl::StatusOr<Stmt*> Db::Prepare(const std::string& sql) {
  auto it = statements_.find(sql);
  if (it != statements_.end()) {
    it->second->Reset();
    return it->second.get();
  }
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v3(db_, sql.c_str(), -1,
                                    SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  if (rc != SQLITE_OK) {
    return LastError(rc, absl::StrCat("prepare ", sql));
  }
  auto stmt = std::unique_ptr<Stmt>(new Stmt(this, raw, sql));
  Stmt* out = stmt.get();
  statements_.emplace(sql, std::move(stmt));
  return out;
}

absl::StatusOr<int64_t> Db::QueryInt(const std::string& sql) {
  Stmt* stmt;
  {
    absl::StatusOr<Stmt*> prepared = Prepare(sql);
    if (!prepared.ok()) {
      return prepared.status();
    }
    stmt = *prepared;
  }
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) {
    return row.status();
  }
  int64_t value = *row ? stmt->ColumnInt(0) : 0;
  stmt->Reset();
  return value;
}

absl::Status Db::ForEachRow(
    const std::string& sql, const std::function<void(Stmt&)>& bind,
    const std::function<absl::StatusOr<bool>(const Stmt&)>& row) {
  absl::StatusOr<Stmt*> prepared = Prepare(sql);
  if (!prepared.ok()) {
    return prepared.status();
  }
  Stmt* stmt = *prepared;
  if (bind) bind(*stmt);
  absl::Status status;
  while (true) {
    absl::StatusOr<bool> has_row = stmt->Step();
    if (!has_row.ok() || !*has_row) {
      status = has_row.status();
      break;
    }
    absl::StatusOr<bool> more = row(*stmt);
    if (!more.ok() || !*more) {
      status = more.status();
      break;
    }
  }
  stmt->Reset();
  return status;
}

absl::StatusOr<std::string> Db::QueryText(const std::string& sql) {
  Stmt* stmt;
  {
    absl::StatusOr<Stmt*> prepared = Prepare(sql);
    if (!prepared.ok()) {
      return prepared.status();
    }
    stmt = *prepared;
  }
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) {
    return row.status();
  }
  std::string value = *row ? stmt->ColumnText(0) : "";
  stmt->Reset();
  return value;
}

int64_t Db::Changes() const { return sqlite3_changes64(db_); }

Transaction::~Transaction() {
  if (open_) {
    // Best effort: a failed rollback leaves SQLite to roll back on close.
    (void)db_->Exec("ROLLBACK");
  }
}

absl::Status Transaction::Begin() {
  absl::Status status = db_->Exec("BEGIN IMMEDIATE");
  if (status.ok()) {
    open_ = true;
  }
  return status;
}

absl::Status Transaction::Commit() {
  absl::Status status = db_->Exec("COMMIT");
  if (status.ok()) {
    open_ = false;
  }
  return status;
}

}  // namespace mutwo::storage
