// UploadWatchdog: drops uploads that stopped sending. An UploadModel call
// holds a sync thread, a place among its principal's running uploads
// (--max_uploads_per_client), its declared bytes and a temp file for as
// long as its client keeps the stream open; a client that sends a header
// and then nothing would hold them forever. Each running upload is watched
// (Watch); every message received touches it; one that received nothing
// for idle_timeout_ms is cancelled (ServerContext::TryCancel): its Read
// returns false, the handler returns, and the session's temp file, its
// place and its bytes are freed. The client sees CANCELLED.
//
// Ownership: the watchdog owns and joins its thread. A Watched context must
// stay alive until its Guard is destroyed (the handler's scope); the
// watchdog never touches a context after that.
// Thread safety: every method is thread-safe; TryCancel runs under the
// watchdog's lock, so it never races with a Guard's destruction.
#ifndef MUTWO_SERVER_UPLOAD_WATCHDOG_H_
#define MUTWO_SERVER_UPLOAD_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace mutwo {

class UploadWatchdog {
 public:
  struct Options {
    int64_t idle_timeout_ms = 30000;  // --upload_idle_timeout_ms
    // Each upload dropped (a metric); may be empty. Called with the lock
    // held: must not call back into the watchdog.
    std::function<void()> observe_dropped;
  };

  // One watched upload; forgotten on destruction.
  class Guard {
   public:
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard();
    // A message arrived.
    void Touch();
    // Whether the watchdog cancelled this upload for being idle.
    bool dropped();

   private:
    friend class UploadWatchdog;
    Guard(UploadWatchdog* owner, uint64_t id) : owner_(owner), id_(id) {}
    UploadWatchdog* owner_;
    uint64_t id_;
  };

  // InvalidArgument when idle_timeout_ms < 1.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UploadWatchdog>> Create(
      Options options);
  ~UploadWatchdog();
  UploadWatchdog(const UploadWatchdog&) = delete;
  UploadWatchdog& operator=(const UploadWatchdog&) = delete;

  std::unique_ptr<Guard> Watch(grpc::ServerContextBase* context);
  int64_t idle_timeout_ms() const { return options_.idle_timeout_ms; }

 private:
  explicit UploadWatchdog(Options options);
  void Run();

  struct Entry {
    grpc::ServerContextBase* context;
    absl::Time last;
    bool dropped = false;
  };
  const Options options_;
  absl::Mutex mu_;
  absl::CondVar stop_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_UPLOAD_WATCHDOG_H_
