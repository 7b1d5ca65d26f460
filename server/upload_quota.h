// UploadQuota: how many bytes of models each principal may keep in the
// model store. Uploads are content-addressed and never deleted, so without
// a quota one client could fill the disk with random bytes for everyone.
// A principal is charged every model it uploaded, once (Store::
// ModelBytesUploadedBy), whoever else uploaded the same bytes; uploading a
// model it already holds costs nothing. Admins (and the '' admin of a
// server without authentication) are not limited; an operator can give a
// principal another quota (--model_quota_overrides).
//
// Admit is asked with the upload's header, before any byte is written:
// stored bytes + bytes of the principal's running uploads + the declared
// size must stay within its quota. The Reservation it returns holds the
// declared bytes until the upload ends (stored, refused or dropped), so
// concurrent uploads of one principal cannot pass the quota together.
//
// Errors: ResourceExhausted naming the principal, what it stores, the
// quota and the flags; errors of the store.
// Ownership: the owner (MutwoServer) outlives every Reservation.
// Thread safety: every method is thread-safe.
#ifndef MUTWO_SERVER_UPLOAD_QUOTA_H_
#define MUTWO_SERVER_UPLOAD_QUOTA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mutwo/v1/planner.pb.h"
#include "server/auth/principal.h"
#include "storage/store.h"

namespace mutwo {

class UploadQuota {
 public:
  static constexpr int64_t kUnlimited = -1;

  struct Options {
    // Bytes of models one principal may keep (--max_stored_model_bytes_
    // per_client); kUnlimited: no quota.
    int64_t max_stored_bytes_per_client = int64_t{4} << 30;
    // Principal -> its own quota (kUnlimited: none), over the default and
    // over the admins' exemption.
    absl::flat_hash_map<std::string, int64_t> overrides;
    // Each refusal (a metric); may be empty.
    std::function<void()> observe_refused;
  };

  // Declared bytes of one running upload; given back on destruction.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Release(); }
    void Release();

   private:
    friend class UploadQuota;
    Reservation(UploadQuota* owner, std::string principal, int64_t bytes)
        : owner_(owner), principal_(std::move(principal)), bytes_(bytes) {}
    UploadQuota* owner_ = nullptr;
    std::string principal_;
    int64_t bytes_ = 0;
  };

  // `store` is not owned and must outlive the quota.
  UploadQuota(Options options, storage::Store* store)
      : options_(std::move(options)), store_(store) {}

  // "alice=20GiB,bob=unlimited" (sizes as ParseBytes); InvalidArgument
  // naming the bad entry.
  [[nodiscard]] static absl::StatusOr<absl::flat_hash_map<std::string, int64_t>>
  ParseOverrides(const std::string& text);

  // The quota of `caller`, or kUnlimited.
  int64_t LimitFor(const auth::Principal& caller) const;
  // Admits an upload declaring `header` by `caller` (see above).
  [[nodiscard]] absl::StatusOr<Reservation> Admit(
      const auth::Principal& caller, const v1::UploadModelHeader& header);

 private:
  void Give(const std::string& principal, int64_t bytes);

  const Options options_;
  storage::Store* store_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> reserved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_UPLOAD_QUOTA_H_
