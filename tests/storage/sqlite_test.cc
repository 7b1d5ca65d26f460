#include "storage/sqlite.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/temp_dir.h"

namespace mutwo::storage {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Db> OpenDb(const std::string& path, int busy_timeout_ms) {
  auto db = Db::Open(path, busy_timeout_ms);
  EXPECT_TRUE(db.ok()) << db.status();
  return std::move(*db);
}

TEST(SqliteTest, TransactionRollsBackUnlessCommitted) {
  testing::TempDir dir;
  auto db = OpenDb(dir.path() + "/t.db", 1000);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (v INTEGER)").ok());
  {
    Transaction txn(db.get());
    ASSERT_TRUE(txn.Begin().ok());
    ASSERT_TRUE(db->Exec("INSERT INTO t VALUES (1)").ok());
  }  // dropped: rolled back
  {
    Transaction txn(db.get());
    ASSERT_TRUE(txn.Begin().ok());
    ASSERT_TRUE(db->Exec("INSERT INTO t VALUES (2)").ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  EXPECT_EQ(*db->QueryInt("SELECT SUM(v) FROM t"), 2);
}

TEST(SqliteTest, WriteLockHeldPastBusyTimeoutIsUnavailable) {
  testing::TempDir dir;
  auto a = OpenDb(dir.path() + "/t.db", 1000);
  auto b = OpenDb(dir.path() + "/t.db", 50);
  ASSERT_TRUE(a->Exec("PRAGMA journal_mode=WAL").ok());
  ASSERT_TRUE(a->Exec("CREATE TABLE t (v INTEGER)").ok());
  Transaction holder(a.get());
  ASSERT_TRUE(holder.Begin().ok());
  Transaction waiter(b.get());
  absl::Status status = waiter.Begin();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("busy timeout"));
  ASSERT_TRUE(holder.Commit().ok());
  EXPECT_TRUE(waiter.Begin().ok());
}

TEST(SqliteTest, ConstraintAndBadSqlErrorsAreMapped) {
  testing::TempDir dir;
  auto db = OpenDb(dir.path() + "/t.db", 1000);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (k TEXT PRIMARY KEY)").ok());
  ASSERT_TRUE(db->Exec("INSERT INTO t VALUES ('a')").ok());
  EXPECT_EQ(db->Exec("INSERT INTO t VALUES ('a')").code(),
            absl::StatusCode::kAlreadyExists);
  auto bad = db->Prepare("SELECT nope FROM t");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("nope"));
}

TEST(SqliteTest, FileThatIsNotADatabaseIsDataLoss) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/junk.db";
  std::ofstream(path) << std::string(8192, 'J');
  auto db = OpenDb(path, 1000);  // SQLite opens lazily
  auto version = db->QueryInt("PRAGMA user_version");
  EXPECT_EQ(version.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(version.status().message(), HasSubstr(path));
}

TEST(SqliteTest, BlobsAndTextRoundTripWithEmbeddedZeros) {
  testing::TempDir dir;
  auto db = OpenDb(dir.path() + "/t.db", 1000);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (b BLOB, s TEXT)").ok());
  const std::string blob("a\0b\0", 4);
  Stmt* insert = *db->Prepare("INSERT INTO t VALUES (?1, ?2)");
  insert->BindBlob(1, blob);
  insert->BindText(2, "text");
  ASSERT_TRUE(insert->Run().ok());
  insert = *db->Prepare("INSERT INTO t VALUES (?1, ?2)");
  insert->BindBlob(1, "");
  insert->BindNull(2);
  ASSERT_TRUE(insert->Run().ok());
  Stmt* select = *db->Prepare("SELECT b, s FROM t ORDER BY rowid");
  ASSERT_TRUE(*select->Step());
  EXPECT_EQ(select->ColumnBlob(0), blob);
  EXPECT_EQ(select->ColumnText(1), "text");
  ASSERT_TRUE(*select->Step());
  EXPECT_FALSE(select->ColumnIsNull(0));  // empty blob stays a blob
  EXPECT_TRUE(select->ColumnIsNull(1));
  EXPECT_FALSE(*select->Step());
}

}  // namespace
}  // namespace mutwo::storage
