// Reading a zip archive (a TorchScript .pt file) without LibTorch: what it
// inflates to, from its central directory without inflating anything
// (torch::jit::load allocates each record's uncompressed size as the
// central directory states it and inflates into it, so these sizes are the
// memory loading will take), and single records (stored or deflated, zlib),
// for the forward schema a server reads before it queues a job
// (common/forward_schema.h).
// Pure functions over bytes the caller owns; thread-safe.
#ifndef MUTWO_COMMON_ZIP_ARCHIVE_H_
#define MUTWO_COMMON_ZIP_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mutwo {

struct ZipInflation {
  int64_t records = 0;
  int64_t compressed_bytes = 0;    // sum over the records
  int64_t uncompressed_bytes = 0;  // sum over the records (zip64 included)
  // What kind of PyTorch archive: TorchScript archives hold code/ records,
  // torch.save's (a pickled module or state dict) hold data.pkl without.
  bool has_code = false;
  bool has_data_pickle = false;
};

// One central directory entry.
struct ZipRecord {
  std::string name;
  int method = 0;  // 0 stored, 8 deflated; others are not read
  uint64_t compressed_bytes = 0;
  uint64_t uncompressed_bytes = 0;
  uint64_t local_header_offset = 0;
  uint32_t crc32 = 0;
};

// Sums the central directory's records. InvalidArgument when there is no
// end-of-central-directory record or the directory runs past the archive.
[[nodiscard]] absl::StatusOr<ZipInflation> ReadZipInflation(
    absl::string_view archive);

// The central directory's entries, in its order. Errors as ReadZipInflation.
[[nodiscard]] absl::StatusOr<std::vector<ZipRecord>> ListZipRecords(
    absl::string_view archive);

// The contents of `record` (from ListZipRecords over the same bytes),
// inflated and its CRC-32 checked. InvalidArgument when the record runs
// past the archive, its data does not inflate to the stated size or CRC,
// or the method is neither stored nor deflated; OutOfRange when it
// inflates to more than `max_bytes` (nothing is inflated then).
[[nodiscard]] absl::StatusOr<std::string> ReadZipRecord(
    absl::string_view archive, const ZipRecord& record, uint64_t max_bytes);

}  // namespace mutwo

#endif  // MUTWO_COMMON_ZIP_ARCHIVE_H_
