#include "storage/schema.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mutwo::storage {
namespace {

// Version 1: the whole store. Protos are serialized BLOBs; the columns next to
// them are what queries filter and sort by (and, for tasks and workers, the
// authoritative mutable state).
constexpr char kSchemaV1[] = R"sql(
CREATE TABLE meta (
  key TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
INSERT INTO meta (key, value) VALUES ('fence_token', 0);

CREATE TABLE models (
  sha256 TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL
);

CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  model_sha256 TEXT NOT NULL,
  client_request_id TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL,
  job BLOB NOT NULL
);
CREATE UNIQUE INDEX jobs_by_request ON jobs (client_request_id)
  WHERE client_request_id <> '';
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_model ON jobs (model_sha256, seq);

CREATE TABLE tasks (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  task_id TEXT NOT NULL UNIQUE,
  job_id TEXT NOT NULL REFERENCES jobs (job_id),
  kind INTEGER NOT NULL,
  state INTEGER NOT NULL,
  batch_size INTEGER NOT NULL,
  device_kind TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  fence_token INTEGER NOT NULL DEFAULT 0,
  lease_owner TEXT NOT NULL DEFAULT '',
  lease_expiry_unix_ms INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NOT NULL DEFAULT '',
  schedule BLOB,
  created_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
CREATE INDEX tasks_by_state ON tasks (state, seq);
CREATE INDEX tasks_by_job ON tasks (job_id, seq);
CREATE INDEX tasks_by_lease ON tasks (state, lease_expiry_unix_ms);

CREATE TABLE task_results (
  task_id TEXT PRIMARY KEY REFERENCES tasks (task_id),
  fence_token INTEGER NOT NULL,
  result BLOB NOT NULL,
  stored_unix_ms INTEGER NOT NULL
);

CREATE TABLE profiles (
  job_id TEXT NOT NULL REFERENCES jobs (job_id),
  batch_size INTEGER NOT NULL,
  graph_fingerprint TEXT NOT NULL,
  profile BLOB NOT NULL,
  updated_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, batch_size)
);

CREATE TABLE schedules (
  cache_key TEXT PRIMARY KEY,
  model_sha256 TEXT NOT NULL,
  batch_size INTEGER NOT NULL,
  job_id TEXT NOT NULL,
  schedule BLOB NOT NULL,
  created_unix_ms INTEGER NOT NULL
);
CREATE INDEX schedules_by_model ON schedules (model_sha256, batch_size);

CREATE TABLE validations (
  job_id TEXT NOT NULL REFERENCES jobs (job_id),
  batch_size INTEGER NOT NULL,
  budget_text TEXT NOT NULL,
  validation BLOB NOT NULL,
  updated_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, batch_size, budget_text)
);

CREATE TABLE workers (
  worker_id TEXT PRIMARY KEY,
  state INTEGER NOT NULL,
  last_heartbeat_unix_ms INTEGER NOT NULL,
  current_task_id TEXT NOT NULL,
  info BLOB NOT NULL
);
)sql";

// Version 2: the profile's DeviceInfo in its own column, so the schedule
// cache key (which needs only the device) is built without parsing the whole
// profile. Rows written by version 1 have NULL here; readers fall back to the
// profile blob.
constexpr char kSchemaV2[] = R"sql(
ALTER TABLE profiles ADD COLUMN device BLOB;
)sql";

// Version 3: every round of mutwo-server's closed loop keeps its validation
// (a schedule measured over its budget is re-planned and validated again),
// so the round joins the key. Rows of version 2 become round 1. SQLite
// cannot change a primary key in place: the table is rebuilt.
constexpr char kSchemaV3[] = R"sql(
CREATE TABLE validations_v3 (
  job_id TEXT NOT NULL REFERENCES jobs (job_id),
  batch_size INTEGER NOT NULL,
  budget_text TEXT NOT NULL,
  round INTEGER NOT NULL,
  validation BLOB NOT NULL,
  updated_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, batch_size, budget_text, round)
);
INSERT INTO validations_v3
  SELECT job_id, batch_size, budget_text, 1, validation, updated_unix_ms
  FROM validations ORDER BY rowid;
DROP TABLE validations;
ALTER TABLE validations_v3 RENAME TO validations;
)sql";

// Version 4: identities, so that one tenant cannot see or change another's
// jobs. A job belongs to the principal that
// submitted it (rows of version 3 get owner '', which only an admin sees),
// client request ids are scoped to their owner (two clients may use the same
// id), every principal that uploaded a model is recorded (a client may only
// submit jobs for models it uploaded itself), and a worker id is bound to
// the principal that registered it.
constexpr char kSchemaV4[] = R"sql(
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
DROP INDEX jobs_by_request;
CREATE UNIQUE INDEX jobs_by_request ON jobs (owner, client_request_id)
  WHERE client_request_id <> '';
CREATE INDEX jobs_by_owner ON jobs (owner, seq);

CREATE TABLE model_uploads (
  sha256 TEXT NOT NULL REFERENCES models (sha256),
  principal TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (sha256, principal)
);

ALTER TABLE workers ADD COLUMN principal TEXT NOT NULL DEFAULT '';
)sql";

// Version 5: schedule cache entries bound to what produced them. Each stored
// profile gets a measurement row (who measured it, its digest, its peak, and
// whether it disagrees with another measurement of the same model, spec,
// batch size and device), and each cache entry records the digest of the
// profile it was planned from and the worker that measured it. Profiles and
// entries of version 4 stay as they were: they have no measurement row (a
// job's entries are then keyed by the digest of its stored profile, computed
// when needed) and their entries keep '' here.
constexpr char kSchemaV5[] = R"sql(
CREATE TABLE profile_measurements (
  job_id TEXT NOT NULL REFERENCES jobs (job_id),
  batch_size INTEGER NOT NULL,
  measurement_key TEXT NOT NULL,
  profile_sha256 TEXT NOT NULL,
  worker_id TEXT NOT NULL,
  worker_principal TEXT NOT NULL,
  tenant TEXT NOT NULL,
  peak_bytes INTEGER NOT NULL,
  flag TEXT NOT NULL DEFAULT '',
  created_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, batch_size)
);
CREATE INDEX profile_measurements_by_key
  ON profile_measurements (measurement_key);

ALTER TABLE schedules ADD COLUMN profile_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE schedules ADD COLUMN measured_by TEXT NOT NULL DEFAULT '';
)sql";

}  // namespace

static absl::Status NewerSchemaError(const Db& db, int64_t version) {
  return absl::FailedPreconditionError(absl::StrCat(
      "database ", db.path(), " has schema version ", version,
      ", newer than the version this mutwo build supports (",
      LatestSchemaVersion(),
      "); run a newer mutwo-server or point --data_dir elsewhere"));
}

const std::vector<Migration>& Migrations() {
  static const std::vector<Migration>* const kMigrations =
      new std::vector<Migration>{{1, kSchemaV1},
                                 {2, kSchemaV2},
                                 {3, kSchemaV3},
                                 {4, kSchemaV4},
                                 {5, kSchemaV5}};
  return *kMigrations;
}

int LatestSchemaVersion() { return Migrations().back().version; }

absl::Status Migrate(Db* db) {
  for (const Migration& migration : Migrations()) {
    // Each step re-reads the version under the write lock: another process
    // may have migrated the file since we looked.
    Transaction txn(db);
    MUTWO_RETURN_IF_ERROR(txn.Begin());
    MUTWO_ASSIGN_OR_RETURN(int64_t version,
                           db->QueryInt("PRAGMA user_version"));
    if (version > LatestSchemaVersion()) {
      return NewerSchemaError(*db, version);
    }
    if (version >= migration.version) {
      continue;  // rolls back an empty txn
    }
    if (version != migration.version - 1) {
      return absl::InternalError(absl::StrCat(
          "database ", db->path(), " is at schema version ", version,
          " but the next migration expects ", migration.version - 1));
    }
    MUTWO_RETURN_IF_ERROR(db->Exec(migration.sql));
    MUTWO_RETURN_IF_ERROR(
        db->Exec(absl::StrCat("PRAGMA user_version = ", migration.version)));
    MUTWO_RETURN_IF_ERROR(txn.Commit());
  }
  // Also refuse newer files when there was nothing to migrate.
  MUTWO_ASSIGN_OR_RETURN(int64_t version, db->QueryInt("PRAGMA user_version"));
  if (version > LatestSchemaVersion()) {
    return NewerSchemaError(*db, version);
  }
  return absl::OkStatus();
}

}  // namespace mutwo::storage
