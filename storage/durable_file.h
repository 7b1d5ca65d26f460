// Crash-safe file writes for the content-addressed model store: the bytes go
// to a uniquely named temp file in the target directory, are fsynced, renamed
// over the final name and the directory is fsynced, so a reader (or a restart
// after a crash) sees either no file or the whole file, never a prefix.
//
// Thread-safe: temp names are unique per call, and rename is atomic.
#ifndef MUTWO_STORAGE_DURABLE_FILE_H_
#define MUTWO_STORAGE_DURABLE_FILE_H_

#include <cstdint>
#include <memory>
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

// A file written in pieces (an upload streamed to disk) under a temp name
// in `dir`, made visible whole by Commit: fsync, rename to the final name,
// fsync of the directory. Never committed, it is removed by the destructor
// (or, after a crash, by RemoveStaleTempFiles). Not thread-safe.
class TempFile {
 public:
  // Errors name the path and errno (ResourceExhausted for a full disk).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TempFile>> Create(
      const std::string& dir, const std::string& name_hint);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();

  [[nodiscard]] absl::Status Append(absl::string_view bytes);
  // Makes the bytes `dir/final_name`; the object is spent afterwards.
  [[nodiscard]] absl::Status Commit(const std::string& final_name);
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  TempFile(std::string dir, std::string path, int fd)
      : dir_(std::move(dir)), path_(std::move(path)), fd_(fd) {}
  std::string dir_, path_;
  int fd_ = -1;
  int64_t size_ = 0;
  bool committed_ = false;
};

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
