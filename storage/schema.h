// The store's versioned schema. The version lives in `PRAGMA user_version`;
// Migrate() applies the migrations above it in order, each in its own
// BEGIN IMMEDIATE transaction together with the version bump, so a crash
// leaves the database at a whole version and two processes opening the same
// file at once migrate it once. A database written by a newer mutwo (version
// above kSchemaVersion) is refused rather than guessed at.
#ifndef MUTWO_STORAGE_SCHEMA_H_
#define MUTWO_STORAGE_SCHEMA_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "storage/sqlite.h"

namespace mutwo::storage {

struct Migration {
  int version;      // user_version after this migration
  const char* sql;  // statements, run in one transaction
};

// Migrations in order; versions are 1, 2, ... without gaps.
const std::vector<Migration>& Migrations();
// The version this build writes (the last migration's).
int LatestSchemaVersion();

// Brings `db` to LatestSchemaVersion(). FailedPrecondition when the file's
// version is newer than this build knows (names both versions and the file).
[[nodiscard]] absl::Status Migrate(Db* db);

}  // namespace mutwo::storage

#endif  // MUTWO_STORAGE_SCHEMA_H_
