// Crash-safe file writes for the content-addressed model store: the bytes go
// to a uniquely named temp file in the target directory, are fsynced, renamed
// over the final name and the directory is fsynced, so a reader (or a restart
// after a crash) sees either no file or the whole file, never a prefix.
//
// Thread-safe: temp names are unique per call, and rename is atomic.
#ifndef MUTWO_STORAGE_DURABLE_FILE_H_
#define MUTWO_STORAGE_DURABLE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mutwo::storage {

// Temp files start with this prefix; nothing else in a store directory does.
inline constexpr char kTempFilePrefix[] = ".tmp-";

// Writes `bytes` to `dir/name` as described above. On any error the temp file
// is removed and `dir/name` is untouched. Errors name the path and errno.
[[nodiscard]] absl::Status WriteFileDurably(const std::string& dir,
                                            const std::string& name,
                                            absl::string_view bytes);

// Creates `dir` (and parents) when missing; FailedPrecondition when it exists
// and is not a directory.
[[nodiscard]] absl::Status MakeDirs(const std::string& dir);

// Removes temp files in `dir` last modified more than `min_age_ms` ago
// (left behind by a process that crashed mid-write; younger ones may belong
// to a writer still running). Returns how many were removed.
[[nodiscard]] absl::StatusOr<int> RemoveStaleTempFiles(const std::string& dir,
                                                       int64_t min_age_ms);

// Size of a regular file, or NotFound.
[[nodiscard]] absl::StatusOr<int64_t> FileSize(const std::string& path);

}  // namespace mutwo::storage

#endif  // MUTWO_STORAGE_DURABLE_FILE_H_
