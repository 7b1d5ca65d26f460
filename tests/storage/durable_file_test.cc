#include "storage/durable_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/temp_dir.h"

namespace mutwo::storage {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int CountEntries(const std::string& dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++n;
  }
  return n;
}

TEST(DurableFileTest, WritesWholeFileAndLeavesNoTemp) {
  testing::TempDir dir;
  const std::string bytes(300'000, 'q');
  ASSERT_TRUE(WriteFileDurably(dir.path(), "m.pt", bytes).ok());
  EXPECT_EQ(ReadAll(dir.path() + "/m.pt"), bytes);
  EXPECT_EQ(CountEntries(dir.path()), 1);
  EXPECT_EQ(*FileSize(dir.path() + "/m.pt"), 300'000);
}

TEST(DurableFileTest, ReplacesAnExistingFileAtomically) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileDurably(dir.path(), "m.pt", "old").ok());
  struct stat before;
  ASSERT_EQ(stat((dir.path() + "/m.pt").c_str(), &before), 0);
  ASSERT_TRUE(WriteFileDurably(dir.path(), "m.pt", "new contents").ok());
  struct stat after;
  ASSERT_EQ(stat((dir.path() + "/m.pt").c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);  // renamed over, not rewritten
  EXPECT_EQ(ReadAll(dir.path() + "/m.pt"), "new contents");
  EXPECT_EQ(CountEntries(dir.path()), 1);
}

TEST(DurableFileTest, ErrorsNameThePath) {
  testing::TempDir dir;
  const std::string missing = dir.path() + "/no-such-dir";
  absl::Status status = WriteFileDurably(missing, "m.pt", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(missing));
  EXPECT_EQ(FileSize(missing).status().code(), absl::StatusCode::kNotFound);
}

TEST(DurableFileTest, MakeDirsCreatesParentsAndRefusesFiles) {
  testing::TempDir dir;
  ASSERT_TRUE(MakeDirs(dir.path() + "/a/b/c").ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() + "/a/b/c"));
  EXPECT_TRUE(MakeDirs(dir.path() + "/a/b/c").ok());  // exists: fine
  std::ofstream(dir.path() + "/file") << "x";
  absl::Status status = MakeDirs(dir.path() + "/file");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("not a directory"));
}

TEST(DurableFileTest, RemoveStaleTempFilesKeepsYoungOnesAndOtherFiles) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/" + kTempFilePrefix + "a") << "partial";
  std::ofstream(dir.path() + "/keep.pt") << "model";
  EXPECT_EQ(*RemoveStaleTempFiles(dir.path(), 60'000), 0);  // too young
  EXPECT_EQ(*RemoveStaleTempFiles(dir.path(), 0), 1);
  EXPECT_EQ(CountEntries(dir.path()), 1);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/keep.pt"));
}

}  // namespace
}  // namespace mutwo::storage
