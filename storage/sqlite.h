// A thin RAII layer over the SQLite C API used by the store: one connection
// (`Db`), prepared statements cached per connection (`Stmt`), and SQLite
// result codes turned into absl::Status that name the statement and the
// database file.
//
// Thread safety: none. A `Db` and its statements belong to one owner that
// serialises access (the Store holds an absl::Mutex around it).
//
// Errors: SQLITE_BUSY / SQLITE_LOCKED -> Unavailable (another connection held
// the write lock longer than the busy timeout), SQLITE_CONSTRAINT ->
// AlreadyExists or FailedPrecondition, SQLITE_CORRUPT / SQLITE_NOTADB ->
// DataLoss, SQLITE_FULL / SQLITE_IOERR -> ResourceExhausted / Internal.
#ifndef MUTWO_STORAGE_SQLITE_H_
#define MUTWO_STORAGE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mutwo::storage {

// Maps a SQLite result code to an absl::Status; `what` says what was being
// done (`"insert into jobs"`), `detail` is sqlite3_errmsg when available.
absl::Status SqliteStatus(int code, absl::string_view what,
                          absl::string_view detail);

class Db;

// A prepared statement owned by its Db and reset after each use. Obtain with
// Db::Prepare; bind parameters by 1-based index; Step() until it returns
// false. The statement is reset (bindings cleared) by Reset() and
// automatically the next time Db::Prepare returns it.
class Stmt {
 public:
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt();

  void BindInt(int index, int64_t value);
  void BindText(int index, absl::string_view value);
  void BindBlob(int index, absl::string_view value);
  void BindNull(int index);

  // Returns true while a row is available, false when done.
  [[nodiscard]] absl::StatusOr<bool> Step();
  // Runs a statement that returns no rows (or ignores them).
  [[nodiscard]] absl::Status Run();

  int64_t ColumnInt(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;
  bool ColumnIsNull(int column) const;
  int ColumnCount() const;

  void Reset();

 private:
  friend class Db;
  Stmt(Db* db, sqlite3_stmt* stmt, std::string sql);

  Db* db_;
  sqlite3_stmt* stmt_;
  std::string sql_;
};

class Db {
 public:
  // Opens (creating when missing) the database at `path` and sets the busy
  // timeout. Pragmas (WAL, synchronous, foreign keys) are the caller's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Db>> Open(
      const std::string& path, int busy_timeout_ms);
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  ~Db();

  // Runs one or more statements that return no rows of interest.
  [[nodiscard]] absl::Status Exec(absl::string_view sql);
  // Prepared once per connection and cached; reset before it is returned.
  [[nodiscard]] absl::StatusOr<Stmt*> Prepare(const std::string& sql);
  // The one row loop of the store: prepares `sql` (cached), lets `bind`
  // (may be empty) set its parameters, then calls `row` for each result row
  // until it returns false or an error, or the rows end. The statement is
  // reset on every way out, so no read stays open on the connection.
  [[nodiscard]] absl::Status ForEachRow(
      const std::string& sql, const std::function<void(Stmt&)>& bind,
      const std::function<absl::StatusOr<bool>(const Stmt&)>& row);
  // Single-value helpers for pragmas and counts.
  [[nodiscard]] absl::StatusOr<int64_t> QueryInt(const std::string& sql);
  [[nodiscard]] absl::StatusOr<std::string> QueryText(const std::string& sql);

  int64_t Changes() const;
  const std::string& path() const { return path_; }
  sqlite3* raw() { return db_; }
  // Status for the last error on this connection.
  absl::Status LastError(int code, absl::string_view what) const;

 private:
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_;
  std::string path_;
  std::map<std::string, std::unique_ptr<Stmt>> statements_;
};

// Every row of `sql`, each turned into a T by `read` (a callable taking
// `const Stmt&` and returning absl::StatusOr<T>); the first error is
// returned. Runs Db::ForEachRow.
template <typename T, typename Read>
absl::StatusOr<std::vector<T>> QueryRows(Db& db, const std::string& sql,
                                         const std::function<void(Stmt&)>& bind,
                                         Read read) {
  std::vector<T> rows;
  absl::Status status =
      db.ForEachRow(sql, bind, [&](const Stmt& stmt) -> absl::StatusOr<bool> {
        absl::StatusOr<T> value = read(stmt);
        if (!value.ok()) return value.status();
        rows.push_back(*std::move(value));
        return true;
      });
  if (!status.ok()) return status;
  return rows;
}

// The first row of `sql` read by `read` as in QueryRows; nullopt when the
// query returns no row.
template <typename T, typename Read>
absl::StatusOr<std::optional<T>> QueryRow(
    Db& db, const std::string& sql, const std::function<void(Stmt&)>& bind,
    Read read) {
  std::optional<T> first;
  absl::Status status =
      db.ForEachRow(sql, bind, [&](const Stmt& stmt) -> absl::StatusOr<bool> {
        absl::StatusOr<T> value = read(stmt);
        if (!value.ok()) return value.status();
        first = *std::move(value);
        return false;
      });
  if (!status.ok()) return status;
  return first;
}

// BEGIN IMMEDIATE ... COMMIT; rolls back in the destructor unless Commit()
// succeeded. IMMEDIATE takes the write lock up front, so two connections
// doing read-modify-write never both read the same old state.
class Transaction {
 public:
  explicit Transaction(Db* db) : db_(db) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction();
  // BEGIN IMMEDIATE; Unavailable when another connection holds the write
  // lock for longer than the busy timeout.
  [[nodiscard]] absl::Status Begin();
  [[nodiscard]] absl::Status Commit();

 private:
  Db* db_;
  bool open_ = false;
};

}  // namespace mutwo::storage

#endif  // MUTWO_STORAGE_SQLITE_H_
