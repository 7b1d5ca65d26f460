#include "common/zip_archive.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mutwo {
namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr size_t kEndOfDirectoryBytes = 22;
constexpr size_t kMaxCommentBytes = 0xffff;
constexpr size_t kDirectoryEntryBytes = 46;
constexpr size_t kLocalHeaderBytes = 30;
constexpr uint64_t kZip64Marker = 0xffffffff;

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

absl::StatusOr<std::vector<ZipRecord>> ListZipRecords(
    absl::string_view archive) {
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
  std::vector<ZipRecord> records;
  uint64_t at = directory_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at > archive.size() || archive.size() - at < kDirectoryEntryBytes ||
        Le(archive, at, 4) != kDirectoryEntry) {
      return Corrupt(
          absl::StrCat("central directory entry ", i, " out of the archive"));
    }
    ZipRecord record;
    record.method = static_cast<int>(Le(archive, at + 10, 2));
    record.crc32 = static_cast<uint32_t>(Le(archive, at + 16, 4));
    record.compressed_bytes = Le(archive, at + 20, 4);
    record.uncompressed_bytes = Le(archive, at + 24, 4);
    record.local_header_offset = Le(archive, at + 42, 4);
    const size_t name_bytes = Le(archive, at + 28, 2);
    const size_t extra_bytes = Le(archive, at + 30, 2);
    const size_t comment_bytes = Le(archive, at + 32, 2);
    const size_t extra = at + kDirectoryEntryBytes + name_bytes;
    if (archive.size() - at <
        kDirectoryEntryBytes + name_bytes + extra_bytes + comment_bytes) {
      return Corrupt(
          absl::StrCat("central directory entry ", i, " out of the archive"));
    }
    // Fields of 0xffffffff are in the zip64 extra field, in the order
    // uncompressed, compressed, local header offset.
    for (size_t field = extra; field + 4 <= extra + extra_bytes;) {
      const size_t field_bytes = Le(archive, field + 2, 2);
      if (Le(archive, field, 2) == kZip64Extra) {
        size_t value = field + 4;
        const size_t value_end =
            std::min(value + field_bytes, extra + extra_bytes);
        for (uint64_t* target :
             {&record.uncompressed_bytes, &record.compressed_bytes,
              &record.local_header_offset}) {
          if (*target == kZip64Marker && value + 8 <= value_end) {
            *target = Le(archive, value, 8);
            value += 8;
          }
        }
      }
      field += 4 + field_bytes;
    }
    record.name =
        std::string(archive.substr(at + kDirectoryEntryBytes, name_bytes));
    records.push_back(std::move(record));
    at += kDirectoryEntryBytes + name_bytes + extra_bytes + comment_bytes;
  }
  return records;
}

absl::StatusOr<ZipInflation> ReadZipInflation(absl::string_view archive) {
  absl::StatusOr<std::vector<ZipRecord>> records = ListZipRecords(archive);
  if (!records.ok()) return records.status();
  ZipInflation inflation;
  constexpr uint64_t kCap = uint64_t{1} << 62;
  for (const ZipRecord& record : *records) {
    const absl::string_view name = record.name;
    if (absl::StrContains(name, "/code/") || absl::StartsWith(name, "code/")) {
      inflation.has_code = true;
    }
    if (absl::EndsWith(name, "data.pkl")) inflation.has_data_pickle = true;
    inflation.records += 1;
    inflation.compressed_bytes +=
        static_cast<int64_t>(std::min(record.compressed_bytes, kCap));
    inflation.uncompressed_bytes +=
        static_cast<int64_t>(std::min(record.uncompressed_bytes, kCap));
    inflation.uncompressed_bytes = std::min<int64_t>(
        inflation.uncompressed_bytes, static_cast<int64_t>(kCap));
  }
  return inflation;
}

absl::StatusOr<std::string> ReadZipRecord(absl::string_view archive,
                                          const ZipRecord& record,
                                          uint64_t max_bytes) {
  const uint64_t at = record.local_header_offset;
  if (at > archive.size() || archive.size() - at < kLocalHeaderBytes ||
      Le(archive, at, 4) != kLocalHeader) {
    return Corrupt(absl::StrCat("record ", record.name,
                                ": local header out of the archive"));
  }
  // The local header's name and extra lengths may differ from the
  // directory's; its sizes may be zero (a data descriptor follows): the
  // directory's are used.
  const uint64_t data = at + kLocalHeaderBytes + Le(archive, at + 26, 2) +
                        Le(archive, at + 28, 2);
  if (data > archive.size() ||
      archive.size() - data < record.compressed_bytes) {
    return Corrupt(
        absl::StrCat("record ", record.name, ": data out of the archive"));
  }
  if (record.uncompressed_bytes > max_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("record ", record.name, " inflates to ",
                     record.uncompressed_bytes, " bytes, over ", max_bytes));
  }
  const absl::string_view compressed =
      archive.substr(data, record.compressed_bytes);
  std::string out;
  if (record.method == 0) {
    out = std::string(compressed);
  } else if (record.method == 8) {
    out.resize(record.uncompressed_bytes);
    z_stream stream{};
    // Raw deflate (no zlib header), as zip stores it.
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {
      return absl::InternalError("zlib: inflateInit2 failed");
    }
    stream.next_in =
        reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
    stream.avail_in = static_cast<uInt>(compressed.size());
    stream.next_out = reinterpret_cast<Bytef*>(out.data());
    stream.avail_out = static_cast<uInt>(out.size());
    const int result = inflate(&stream, Z_FINISH);
    const uint64_t produced = stream.total_out;
    inflateEnd(&stream);
    if (result != Z_STREAM_END || produced != record.uncompressed_bytes) {
      return Corrupt(absl::StrCat("record ", record.name,
                                  " does not inflate to its stated size"));
    }
  } else {
    return Corrupt(absl::StrCat("record ", record.name, ": compression method ",
                                record.method,
                                " (only stored and deflated are read)"));
  }
  if (out.size() != record.uncompressed_bytes) {
    return Corrupt(
        absl::StrCat("record ", record.name, ": size differs from the stated"));
  }
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(out.data()),
            static_cast<uInt>(out.size())));
  if (crc != record.crc32) {
    return Corrupt(absl::StrCat("record ", record.name, ": CRC-32 mismatch"));
  }
  return out;
}

}  // namespace mutwo
