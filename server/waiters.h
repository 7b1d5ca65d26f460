// WaiterSet: long waits (LeaseTask polls, WatchJob streams) that hold no
// thread while they wait. A waiter is registered with a deadline and woken
// by the events that can satisfy it: Notify() (a job or task changed), its
// deadline, Wake(id) (the client cancelled, a streamed write completed) and
// Shutdown(). One dispatcher thread, owned and joined here, runs the wakes;
// a waiter that answers "finished" is forgotten at once.
//
// At most Options::max_waiters wait at once; Add beyond that is refused with
// ResourceExhausted carrying a retry hint (RetryAfterMs of the status), so an
// overloaded server answers instead of queueing without bound.
//
// Ownership: the set never owns a waiter. A waiter must stay alive until its
// OnWake returned true (or Add failed); after that the set never touches it.
// OnWake calls for one waiter never overlap (one dispatcher thread).
//
// Thread safety: every method is thread-safe; OnWake runs without the set's
// lock held, so a waiter may call Wake and Add.
#ifndef MUTWO_SERVER_WAITERS_H_
#define MUTWO_SERVER_WAITERS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mutwo {

class WaiterSet {
 public:
  // Why a waiter is woken, most urgent first when several apply.
  enum class Why {
    kCancelled,  // Wake(id, Why::kCancelled): the client left; must finish
    kShutdown,   // the set shuts down; must finish
    kDeadline,   // its deadline passed; must finish
    kChanged,    // Notify() or Wake(id, kChanged): look again
  };

  class Waiter {
   public:
    virtual ~Waiter() = default;
    // Returns true when the waiter finished (answered its caller); it must
    // for kCancelled, kShutdown and kDeadline.
    virtual bool OnWake(Why why) = 0;
  };

  struct Options {
    // Names the waiters in messages, e.g. "lease polls".
    std::string what = "waiters";
    // The flag that sets max_waiters, named in the refusal.
    std::string flag;
    int max_waiters = 1000;
    // The retry hint of a refusal.
    int64_t retry_after_ms = 1000;
    // Metrics (may be empty): the number waiting after each change, and
    // each refusal at the limit. Called with the set's lock held: they
    // must not call back into the set.
    std::function<void(int waiting)> observe_waiting;
    std::function<void()> observe_refused;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WaiterSet>> Create(
      Options options);
  ~WaiterSet();
  WaiterSet(const WaiterSet&) = delete;
  WaiterSet& operator=(const WaiterSet&) = delete;

  // Registers `waiter` and wakes it once at once (kChanged), so an event
  // between the caller's last look and Add is never missed. Returns its id.
  // ResourceExhausted (with RetryAfterMs) when max_waiters already wait,
  // Unavailable once Shutdown() began.
  [[nodiscard]] absl::StatusOr<uint64_t> Add(Waiter* waiter,
                                             absl::Time deadline);
  // Something changed: every waiter is woken (kChanged).
  void Notify();
  // Wakes one waiter; a waiter already finished is ignored.
  void Wake(uint64_t id, Why why);
  // Wakes every waiter with kShutdown, waits until all finished, refuses
  // further Add. Idempotent.
  void Shutdown();
  int size();

  // The retry hint of a ResourceExhausted status from Add, if it has one.
  static std::optional<int64_t> RetryAfterMs(const absl::Status& status);
  // ResourceExhausted with `message` and a retry hint RetryAfterMs reads
  // (for the other limits on long waits, principal_limits.h).
  static absl::Status RetryLater(const std::string& message,
                                 int64_t retry_after_ms);

 private:
  explicit WaiterSet(Options options);
  void Dispatch();
  void Observe() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Entry {
    Waiter* waiter;
    absl::Time deadline;
    bool changed = true;
    bool cancelled = false;
    bool told_to_finish = false;
  };

  const Options options_;
  absl::Mutex mu_;
  absl::CondVar work_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex join_mu_;
  std::thread dispatcher_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_WAITERS_H_
