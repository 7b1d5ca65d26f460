#include "worker/zip_archive.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mutwo::worker {
namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr size_t kEndOfDirectoryBytes = 22;
constexpr size_t kMaxCommentBytes = 0xffff;
constexpr size_t kDirectoryEntryBytes = 46;

uint64_t Le(absl::string_view bytes, size_t offset, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  }
  return value;
}

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("not a readable zip archive: ", what));
}

}  // namespace

absl::StatusOr<ZipInflation> ReadZipInflation(absl::string_view archive) {
  if (archive.size() < kEndOfDirectoryBytes) {
    return Corrupt("shorter than an end-of-central-directory record");
  }
  // The end record is the last thing in the file, before a comment of up
  // to 64 KiB.
  const size_t lowest =
      archive.size() >= kEndOfDirectoryBytes + kMaxCommentBytes
          ? archive.size() - kEndOfDirectoryBytes - kMaxCommentBytes
          : 0;
  size_t end = archive.size() - kEndOfDirectoryBytes;
  while (Le(archive, end, 4) != kEndOfDirectory) {
    if (end == lowest) return Corrupt("no end-of-central-directory record");
    --end;
  }
  uint64_t entries = Le(archive, end + 10, 2);
  uint64_t directory_offset = Le(archive, end + 16, 4);
  // Zip64: a locator just before the end record points at a larger one.
  if (end >= 20 && Le(archive, end - 20, 4) == kZip64Locator) {
    const uint64_t zip64_end = Le(archive, end - 20 + 8, 8);
    if (zip64_end > archive.size() || archive.size() - zip64_end < 56 ||
        Le(archive, zip64_end, 4) != kZip64EndOfDirectory) {
      return Corrupt("zip64 end record out of the archive");
    }
    entries = Le(archive, zip64_end + 32, 8);
    directory_offset = Le(archive, zip64_end + 48, 8);
  }
  ZipInflation inflation;
  size_t at = directory_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at > archive.size() || archive.size() - at < kDirectoryEntryBytes ||
        Le(archive, at, 4) != kDirectoryEntry) {
      return Corrupt(
          absl::StrCat("central directory entry ", i, " out of the archive"));
    }
    uint64_t compressed = Le(archive, at + 20, 4);
    uint64_t uncompressed = Le(archive, at + 24, 4);
    const size_t name_bytes = Le(archive, at + 28, 2);
    const size_t extra_bytes = Le(archive, at + 30, 2);
    const size_t comment_bytes = Le(archive, at + 32, 2);
    const size_t extra = at + kDirectoryEntryBytes + name_bytes;
    if (archive.size() - at <
        kDirectoryEntryBytes + name_bytes + extra_bytes + comment_bytes) {
      return Corrupt(
          absl::StrCat("central directory entry ", i, " out of the archive"));
    }
    // Sizes of 0xffffffff are in the zip64 extra field, uncompressed first.
    for (size_t field = extra; field + 4 <= extra + extra_bytes;) {
      const size_t field_bytes = Le(archive, field + 2, 2);
      if (Le(archive, field, 2) == kZip64Extra) {
        size_t value = field + 4;
        const size_t value_end =
            std::min(value + field_bytes, extra + extra_bytes);
        if (uncompressed == 0xffffffff && value + 8 <= value_end) {
          uncompressed = Le(archive, value, 8);
          value += 8;
        }
        if (compressed == 0xffffffff && value + 8 <= value_end) {
          compressed = Le(archive, value, 8);
        }
      }
      field += 4 + field_bytes;
    }
    const absl::string_view name =
        archive.substr(at + kDirectoryEntryBytes, name_bytes);
    if (absl::StrContains(name, "/code/") || absl::StartsWith(name, "code/")) {
      inflation.has_code = true;
    }
    if (absl::EndsWith(name, "data.pkl")) inflation.has_data_pickle = true;
    inflation.records += 1;
    inflation.compressed_bytes +=
        static_cast<int64_t>(std::min<uint64_t>(compressed, uint64_t{1} << 62));
    inflation.uncompressed_bytes += static_cast<int64_t>(
        std::min<uint64_t>(uncompressed, uint64_t{1} << 62));
    inflation.uncompressed_bytes =
        std::min<int64_t>(inflation.uncompressed_bytes, int64_t{1} << 62);
    at += kDirectoryEntryBytes + name_bytes + extra_bytes + comment_bytes;
  }
  return inflation;
}

}  // namespace mutwo::worker
