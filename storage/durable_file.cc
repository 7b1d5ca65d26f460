#include "storage/durable_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace mutwo::storage {
namespace {

absl::Status ErrnoStatus(int error, absl::string_view what,
                         absl::string_view path) {
  const std::string message =
      absl::StrCat(what, " ", path, ": ", std::strerror(error));
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) {
    return ErrnoStatus(errno, "open", path);
  }
  const int rc = fsync(fd);
  const int error = errno;
  close(fd);
  if (rc != 0) {
    return ErrnoStatus(error, "fsync", path);
  }
  return absl::OkStatus();
}

std::string RandomSuffix() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%016x", rng());
}

}  // namespace

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("empty directory path");
  }
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " exists and is not a directory"));
    }
    return absl::OkStatus();
  }
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status parent = MakeDirs(dir.substr(0, slash));
    if (!parent.ok()) {
      return parent;
    }
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "mkdir", dir);
  }
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& dir, const std::string& name,
                              absl::string_view bytes) {
  const std::string final_path = absl::StrCat(dir, "/", name);
  const std::string temp_path =
      absl::StrCat(dir, "/", kTempFilePrefix, name, "-", RandomSuffix());
  const int fd =
      open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoStatus(errno, "create", temp_path);
  }
  absl::Status status;
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      status = ErrnoStatus(errno, "write", temp_path);
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (status.ok() && fsync(fd) != 0) {
    status = ErrnoStatus(errno, "fsync", temp_path);
  }
  if (close(fd) != 0 && status.ok()) {
    status = ErrnoStatus(errno, "close", temp_path);
  }
  if (status.ok() && rename(temp_path.c_str(), final_path.c_str()) != 0) {
    status = ErrnoStatus(errno, "rename to " + final_path, temp_path);
  }
  if (!status.ok()) {
    unlink(temp_path.c_str());
    return status;
  }
  // The rename is durable only once the directory entry is on disk.
  return FsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

absl::StatusOr<std::unique_ptr<TempFile>> TempFile::Create(
    const std::string& dir, const std::string& name_hint) {
  std::string path =
      absl::StrCat(dir, "/", kTempFilePrefix, name_hint, "-", RandomSuffix());
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoStatus(errno, "create", path);
  }
  return std::unique_ptr<TempFile>(new TempFile(dir, std::move(path), fd));
}

TempFile::~TempFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(path_.c_str());
}

absl::Status TempFile::Append(absl::string_view bytes) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": already committed or failed"));
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n =
        write(fd_, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path_);
    }
    written += static_cast<size_t>(n);
  }
  size_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status TempFile::Commit(const std::string& final_name) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": already committed or failed"));
  }
  absl::Status status;
  if (fsync(fd_) != 0) status = ErrnoStatus(errno, "fsync", path_);
  if (close(fd_) != 0 && status.ok()) {
    status = ErrnoStatus(errno, "close", path_);
  }
  fd_ = -1;
  MUTWO_RETURN_IF_ERROR(status);
  const std::string final_path = absl::StrCat(dir_, "/", final_name);
  if (rename(path_.c_str(), final_path.c_str()) != 0) {
    return ErrnoStatus(errno, "rename to " + final_path, path_);
  }
  committed_ = true;
  return FsyncPath(dir_, O_RDONLY | O_DIRECTORY);
}

absl::StatusOr<int> RemoveStaleTempFiles(const std::string& dir,
                                         int64_t min_age_ms) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    return ErrnoStatus(errno, "opendir", dir);
  }
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ms =
      static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
  int removed = 0;
  while (struct dirent* entry = readdir(d)) {
    if (!absl::StartsWith(entry->d_name, kTempFilePrefix)) {
      continue;
    }
    const std::string path = absl::StrCat(dir, "/", entry->d_name);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      continue;  // raced with its writer
    }
    const int64_t mtime_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 +
                             st.st_mtim.tv_nsec / 1000000;
    if (now_ms - mtime_ms < min_age_ms) {
      continue;
    }
    if (unlink(path.c_str()) == 0) {
      ++removed;
    }
  }
  closedir(d);
  return removed;
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return ErrnoStatus(errno, "stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

}  // namespace mutwo::storage
