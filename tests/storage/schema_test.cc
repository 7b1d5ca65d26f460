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
