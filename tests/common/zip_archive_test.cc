// ReadZipInflation on archives written by Python's zipfile (as torch.save's
// are zip files): stored and deflated records, a comment,
// zip64 sizes of a hand-made directory, a truncated directory, and bytes that
// are no zip at all.
#include "common/zip_archive.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/command.h"

namespace mutwo {
namespace {

// Runs `body` (Python statements with `zipfile` imported and `z` an open
// ZipFile writing to a file) and returns the archive's bytes.
std::string MakeZip(const std::string& name, const std::string& body) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) /
       absl::StrCat("zip_archive_test_", getpid(), "_", name, ".zip"))
          .string();
  const std::string script = absl::StrCat(
      "import zipfile\nwith zipfile.ZipFile('", path, "', 'w') as z:\n", body);
  const std::string script_path = path + ".py";
  std::ofstream(script_path) << script;
  const auto made =
      testing::RunCommand(absl::StrCat("/usr/bin/python3 ", script_path));
  EXPECT_EQ(made.exit_code, 0) << made.output;
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::filesystem::remove(path);
  std::filesystem::remove(script_path);
  return bytes.str();
}

TEST(ZipArchiveTest, StoredRecordsInflateToTheirOwnSize) {
  const std::string zip =
      MakeZip("stored",
              "    z.writestr('archive/data/0', b'x' * 1000)\n"
              "    z.writestr('archive/version', b'3')\n");
  const auto inflation = ReadZipInflation(zip);
  ASSERT_TRUE(inflation.ok()) << inflation.status();
  EXPECT_EQ(inflation->records, 2);
  EXPECT_EQ(inflation->uncompressed_bytes, 1001);
  EXPECT_EQ(inflation->compressed_bytes, 1001);
}

TEST(ZipArchiveTest, DeflatedZerosReportTheirInflatedSize) {
  const std::string zip =
      MakeZip("deflated",
              "    z.writestr('archive/data/0', bytes(64 << 20), "
              "compress_type=zipfile.ZIP_DEFLATED)\n");
  const auto inflation = ReadZipInflation(zip);
  ASSERT_TRUE(inflation.ok()) << inflation.status();
  EXPECT_EQ(inflation->uncompressed_bytes, int64_t{64} << 20);
  EXPECT_LT(inflation->compressed_bytes, 100 << 10);
  EXPECT_LT(zip.size(), 100u << 10);
}

TEST(ZipArchiveTest, AnArchiveCommentIsSkipped) {
  const std::string zip =
      MakeZip("comment",
              "    z.comment = b'c' * 1000\n"
              "    z.writestr('archive/data/0', b'x' * 10)\n");
  const auto inflation = ReadZipInflation(zip);
  ASSERT_TRUE(inflation.ok()) << inflation.status();
  EXPECT_EQ(inflation->uncompressed_bytes, 10);
}

// Little-endian field writers for a hand-made central directory.
void Put(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i)
    out.push_back(char((value >> (8 * i)) & 0xff));
}

TEST(ZipArchiveTest, Zip64SizesComeFromTheExtraField) {
  // One central directory entry whose 32-bit sizes are 0xffffffff, with
  // the zip64 extra field holding 5 GiB uncompressed and 5 MiB compressed
  // (what a deflated 5 GiB record looks like), then the end record.
  const std::string name = "archive/data/0";
  std::string zip;
  Put(zip, 0x02014b50, 4);   // central directory entry
  Put(zip, 45, 2);           // version made by
  Put(zip, 45, 2);           // version needed
  Put(zip, 0, 2);            // flags
  Put(zip, 8, 2);            // deflate
  Put(zip, 0, 4);            // time, date
  Put(zip, 0, 4);            // crc
  Put(zip, 0xffffffff, 4);   // compressed size: in zip64 extra
  Put(zip, 0xffffffff, 4);   // uncompressed size: in zip64 extra
  Put(zip, name.size(), 2);  // name length
  Put(zip, 4 + 16, 2);       // extra length
  Put(zip, 0, 2);            // comment length
  Put(zip, 0, 2);            // disk
  Put(zip, 0, 2);            // internal attributes
  Put(zip, 0, 4);            // external attributes
  Put(zip, 0, 4);            // local header offset
  zip += name;
  Put(zip, 0x0001, 2);  // zip64 extra
  Put(zip, 16, 2);
  Put(zip, int64_t{5} << 30, 8);  // uncompressed
  Put(zip, int64_t{5} << 20, 8);  // compressed
  const size_t directory_bytes = zip.size();
  Put(zip, 0x06054b50, 4);  // end of central directory
  Put(zip, 0, 4);           // disks
  Put(zip, 1, 2);           // entries on this disk
  Put(zip, 1, 2);           // entries
  Put(zip, directory_bytes, 4);
  Put(zip, 0, 4);  // directory offset
  Put(zip, 0, 2);  // comment length
  const auto inflation = ReadZipInflation(zip);
  ASSERT_TRUE(inflation.ok()) << inflation.status();
  EXPECT_EQ(inflation->records, 1);
  EXPECT_EQ(inflation->uncompressed_bytes, int64_t{5} << 30);
  EXPECT_EQ(inflation->compressed_bytes, int64_t{5} << 20);
}

TEST(ZipArchiveTest, TruncatedOrForeignBytesAreRefusedByName) {
  const std::string zip =
      MakeZip("truncated", "    z.writestr('archive/data/0', b'x' * 100)\n");
  // Cut inside the central directory, keep the end record: the directory
  // offset now points past what is left.
  const std::string cut = zip.substr(0, 60) + zip.substr(zip.size() - 22);
  const auto truncated = ReadZipInflation(cut);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("central directory"),
            std::string::npos)
      << truncated.status();
  const auto foreign = ReadZipInflation(std::string(100, 'a'));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("end-of-central-directory"),
            std::string::npos)
      << foreign.status();
  EXPECT_FALSE(ReadZipInflation("PK").ok());
}

}  // namespace
}  // namespace mutwo
