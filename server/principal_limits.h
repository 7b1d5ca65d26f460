// PrincipalLimits: how many of one kind of long-held place (open WatchJob
// streams, LeaseTask polls) one principal may hold at once. The global
// limits (--max_watchers, --max_lease_waiters) protect the server; these
// protect the other principals: without them one client or one worker token
// could open the global limit's worth of waits and every other principal's
// watch or poll would be refused.
//
// A place is a Slot, held by the RPC that uses it (the reactor) and given
// back when the Slot is destroyed, however the RPC ends. Past the limit
// Acquire answers ResourceExhausted naming the principal, the count, the
// flag and when to retry (WaiterSet::RetryAfterMs reads the hint).
//
// The principal '' (authentication off: every caller is the same admin) is
// not limited: there the global limit is the only one that can apply.
//
// Ownership: the owner (MutwoServer) must outlive every Slot.
// Thread safety: every method is thread-safe.
#ifndef MUTWO_SERVER_PRINCIPAL_LIMITS_H_
#define MUTWO_SERVER_PRINCIPAL_LIMITS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mutwo {

class PrincipalLimits {
 public:
  struct Options {
    // What is counted, in messages: "watches", "lease polls".
    std::string what = "places";
    // The flag that sets max_per_principal, named in the refusal.
    std::string flag;
    int max_per_principal = 250;
    int64_t retry_after_ms = 1000;
    // Each refusal (a metric); may be empty.
    std::function<void()> observe_refused;
  };

  // One principal's place; given back on destruction. Movable.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Release(); }
    void Release();

   private:
    friend class PrincipalLimits;
    Slot(PrincipalLimits* owner, std::string principal)
        : owner_(owner), principal_(std::move(principal)) {}
    PrincipalLimits* owner_ = nullptr;
    std::string principal_;
  };

  // InvalidArgument when max_per_principal < 1.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PrincipalLimits>> Create(
      Options options);

  // A place for `principal`, or ResourceExhausted (with a retry hint) when
  // it already holds max_per_principal.
  [[nodiscard]] absl::StatusOr<Slot> Acquire(const std::string& principal);
  // Places `principal` holds now.
  int held(const std::string& principal);

 private:
  explicit PrincipalLimits(Options options) : options_(std::move(options)) {}
  void Give(const std::string& principal);

  const Options options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_PRINCIPAL_LIMITS_H_
