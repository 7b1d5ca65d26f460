#include "storage/schema.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/sqlite.h"
#include "tests/storage/temp_dir.h"

namespace mutwo::storage {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Db> OpenDb(const testing::TempDir& dir) {
  auto db = Db::Open(dir.path() + "/t.db", 1000);
  EXPECT_TRUE(db.ok()) << db.status();
  return std::move(*db);
}

TEST(SchemaTest, MigrationVersionsAreContiguousFromOne) {
  int expected = 1;
  for (const Migration& m : Migrations()) EXPECT_EQ(m.version, expected++);
  EXPECT_EQ(LatestSchemaVersion(), expected - 1);
}

TEST(SchemaTest, MigratesAnEmptyFileAndIsIdempotent) {
  testing::TempDir dir;
  auto db = OpenDb(dir);
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), 0);
  ASSERT_TRUE(Migrate(db.get()).ok());
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  ASSERT_TRUE(db->Exec("INSERT INTO models VALUES ('s', 'n', 1, 2)").ok());
  ASSERT_TRUE(Migrate(db.get()).ok());  // a second start changes nothing
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM models"), 1);
  EXPECT_EQ(*db->QueryInt("SELECT value FROM meta WHERE key='fence_token'"), 0);
}

// A file written by the first release (version 1) is brought up to date in
// place and keeps its rows.
TEST(SchemaTest, UpgradesAVersion1FileKeepingItsRows) {
  testing::TempDir dir;
  auto db = OpenDb(dir);
  ASSERT_TRUE(db->Exec(Migrations()[0].sql).ok());
  ASSERT_TRUE(db->Exec("PRAGMA user_version = 1").ok());
  ASSERT_TRUE(db->Exec("INSERT INTO models VALUES ('s', 'n', 1, 2);"
                       "INSERT INTO jobs (job_id, state, model_sha256, "
                       "client_request_id, created_unix_ms, updated_unix_ms, "
                       "job) VALUES ('job-1', 1, 's', '', 0, 0, x'');"
                       "INSERT INTO profiles VALUES ('job-1', 8, 'fp', x'', 0)")
                  .ok());
  ASSERT_TRUE(Migrate(db.get()).ok());
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM profiles WHERE job_id = "
                          "'job-1' AND device IS NULL"),
            1);
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM models"), 1);
}

// Version 2 kept one validation per (job, batch, budget); version 3 keys
// them by round too, and the old rows become round 1.
TEST(SchemaTest, UpgradesVersion2ValidationsToRound1) {
  testing::TempDir dir;
  auto db = OpenDb(dir);
  ASSERT_TRUE(db->Exec(Migrations()[0].sql).ok());
  ASSERT_TRUE(db->Exec(Migrations()[1].sql).ok());
  ASSERT_TRUE(db->Exec("PRAGMA user_version = 2").ok());
  ASSERT_TRUE(db->Exec("INSERT INTO models VALUES ('s', 'n', 1, 2);"
                       "INSERT INTO jobs (job_id, state, model_sha256, "
                       "client_request_id, created_unix_ms, updated_unix_ms, "
                       "job) VALUES ('job-1', 1, 's', '', 0, 0, x'');"
                       "INSERT INTO validations VALUES "
                       "('job-1', 8, '60%', x'2801', 7)")
                  .ok());
  ASSERT_TRUE(Migrate(db.get()).ok());
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(*db->QueryInt("SELECT round FROM validations WHERE job_id = "
                          "'job-1' AND batch_size = 8 AND budget_text = '60%' "
                          "AND updated_unix_ms = 7"),
            1);
  // A second round of the same budget now has a row of its own.
  ASSERT_TRUE(db->Exec("INSERT INTO validations VALUES "
                       "('job-1', 8, '60%', 2, x'', 8)")
                  .ok());
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM validations"), 2);
}

// Version 4 (identities): jobs and workers of version 3 get owner and
// principal '' (only an admin sees such jobs), and client request ids become
// unique per owner, not globally.
TEST(SchemaTest, UpgradesVersion3RowsToOwnerEmpty) {
  testing::TempDir dir;
  auto db = OpenDb(dir);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(db->Exec(Migrations()[i].sql).ok());
  }
  ASSERT_TRUE(db->Exec("PRAGMA user_version = 3").ok());
  ASSERT_TRUE(db->Exec("INSERT INTO models VALUES ('s', 'n', 1, 2);"
                       "INSERT INTO jobs (job_id, state, model_sha256, "
                       "client_request_id, created_unix_ms, updated_unix_ms, "
                       "job) VALUES ('job-1', 1, 's', 'req', 0, 0, x'');"
                       "INSERT INTO workers VALUES ('w', 1, 0, '', x'')")
                  .ok());
  ASSERT_TRUE(Migrate(db.get()).ok());
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(*db->QueryText("SELECT owner FROM jobs WHERE job_id = 'job-1'"),
            "");
  EXPECT_EQ(*db->QueryText("SELECT principal FROM workers"), "");
  // Another owner may reuse the request id; the same owner may not.
  EXPECT_TRUE(db->Exec("INSERT INTO jobs (job_id, state, model_sha256, "
                       "client_request_id, created_unix_ms, updated_unix_ms, "
                       "job, owner) VALUES ('job-2', 1, 's', 'req', 0, 0, "
                       "x'', 'alice')")
                  .ok());
  EXPECT_FALSE(db->Exec("INSERT INTO jobs (job_id, state, model_sha256, "
                        "client_request_id, created_unix_ms, updated_unix_ms, "
                        "job, owner) VALUES ('job-3', 1, 's', 'req', 0, 0, "
                        "x'', 'alice')")
                   .ok());
}

TEST(SchemaTest, RefusesNewerVersionAndLeavesItUntouched) {
  testing::TempDir dir;
  auto db = OpenDb(dir);
  const int newer = LatestSchemaVersion() + 5;
  ASSERT_TRUE(db->Exec(absl::StrCat("PRAGMA user_version = ", newer)).ok());
  absl::Status status = Migrate(db.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(newer)));
  EXPECT_THAT(status.message(), HasSubstr(dir.path() + "/t.db"));
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), newer);
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM sqlite_master"), 0);
}

}  // namespace
}  // namespace mutwo::storage
