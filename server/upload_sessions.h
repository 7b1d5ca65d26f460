// Model uploads as JobCore takes them: UploadSession verifies one streamed
// upload (header first, then chunks); UploadSessions opens them within each
// principal's limits on running uploads and their declared bytes.
//
// An UploadSession never holds the bytes in memory: each chunk is hashed and
// appended to a temp file of the model store (`open_file`; none: only
// hashed, for tests), which only becomes a model once Finish() has checked
// the size and the sha256 and JobCore::StoreUpload commits it. `admit` (may
// be empty) is asked for the declared size before anything is written (the
// per-client byte quota); `done` runs when the session ends, however it
// ends.
//
// Ownership: a session owns its temp file. UploadSessions must outlive every
// session it opened (their `admit` and `done` call back into it); the store
// it is given must outlive it.
// Thread safety: one session is used by one thread (the UploadModel
// handler); UploadSessions is thread-safe.
// Errors: InvalidArgument naming what the stream got wrong (no header, a
// second one, a bad sha256, a size or hash mismatch, a chunk over 1 MiB);
// ResourceExhausted naming the limit and its flag (--max_model_bytes,
// --max_uploads_per_client, --max_upload_bytes_per_client); the store's
// errors opening or writing the temp file.
#ifndef MUTWO_SERVER_UPLOAD_SESSIONS_H_
#define MUTWO_SERVER_UPLOAD_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"
#include "mutwo/v1/planner.pb.h"
#include "storage/store.h"

namespace mutwo {

class UploadSession {
 public:
  static constexpr int64_t kMaxChunkBytes = 1 << 20;

  using OpenFile =
      std::function<absl::StatusOr<std::unique_ptr<storage::TempFile>>()>;
  explicit UploadSession(int64_t max_model_bytes, OpenFile open_file = nullptr,
                         std::function<absl::Status(int64_t)> admit = nullptr,
                         std::function<void()> done = nullptr);
  ~UploadSession();
  UploadSession(const UploadSession&) = delete;
  UploadSession& operator=(const UploadSession&) = delete;
  [[nodiscard]] absl::Status Header(const v1::UploadModelHeader& header);
  [[nodiscard]] absl::Status Chunk(const std::string& bytes);
  // Errors name the mismatch.
  [[nodiscard]] absl::Status Finish();
  const v1::UploadModelHeader& header() const { return header_; }
  int64_t received_bytes() const { return received_; }
  // The temp file holding the bytes (null without `open_file`).
  storage::TempFile* file() { return file_.get(); }

 private:
  int64_t max_model_bytes_;
  OpenFile open_file_;
  std::function<absl::Status(int64_t)> admit_;
  std::function<void()> done_;
  bool has_header_ = false;
  v1::UploadModelHeader header_;
  Sha256 sha_;
  int64_t received_ = 0;
  std::unique_ptr<storage::TempFile> file_;
};

class UploadSessions {
 public:
  struct Options {
    int64_t max_model_bytes = int64_t{512} << 20;
    // Uploads running at once per principal, and their declared bytes
    // together (0: 2 x max_model_bytes).
    int max_uploads_per_client = 2;
    int64_t max_upload_bytes_per_client = 0;
  };
  // `store` (temp files) is not owned.
  UploadSessions(Options options, storage::Store* store)
      : options_(options), store_(store) {}

  // A new upload of `principal`, streamed to a temp file of the store.
  // ResourceExhausted when the principal already runs max_uploads_per_client
  // uploads; the session's Header() is refused when the declared sizes of
  // the principal's running uploads would pass the byte limit.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<UploadSession>> Open(
      const std::string& principal);

 private:
  struct ClientUploads {
    int running = 0;
    int64_t declared_bytes = 0;
  };
  int64_t MaxBytesPerClient() const;
  absl::Status Admit(const std::string& principal, int64_t declared);
  void End(const std::string& principal, int64_t admitted);

  const Options options_;
  storage::Store* store_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, ClientUploads> uploads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_UPLOAD_SESSIONS_H_
