// ScheduleCache: planned schedules by ScheduleCacheKey (storage/schedule_key.h:
// model, spec, batch size, device, budget, policy, planner version). Entries
// are durable in the Store, so every job and a restarted server share them;
// a bounded in-memory copy answers the GetSchedule hot path without SQLite.
//
// Entries carry the Pareto curve and the timeline; Get() hands out the view a
// request asks for (the copy without either is kept ready: most requests
// want it, and it is the cheapest to send).
//
// The closed loop (job_core.h) replaces entries: with a schedule re-planned
// after a validation measured over the budget, and with a validated schedule
// marked with what the worker measured (over the budget: feasible = false),
// so that no one is served a schedule as fitting that measured over it.
//
// Thread-safe. Errors are the Store's.
#ifndef MUTWO_SERVER_SCHEDULE_CACHE_H_
#define MUTWO_SERVER_SCHEDULE_CACHE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mutwo/v1/types.pb.h"
#include "server/metrics.h"
#include "storage/schedule_key.h"
#include "storage/store.h"

namespace mutwo {

class ScheduleCache {
 public:
  static constexpr size_t kHotEntries = 4096;

  ScheduleCache(storage::Store* store, ServerMetrics* metrics)
      : store_(store), metrics_(metrics) {}

  // The entry for `key` (with the Pareto curve and the timeline only when
  // asked), nullopt on a miss. Counts hits and misses.
  [[nodiscard]] absl::StatusOr<std::optional<v1::Schedule>> Get(
      const storage::ScheduleCacheKey& key, bool include_pareto,
      bool include_timeline);
  // The whole entry, for the server's own bookkeeping (not counted).
  [[nodiscard]] absl::StatusOr<std::optional<v1::Schedule>> Peek(
      const storage::ScheduleCacheKey& key);
  // Stores or replaces the entry for `key`; `job_id` records who planned it.
  [[nodiscard]] absl::Status Put(const storage::ScheduleCacheKey& key,
                                 const std::string& job_id,
                                 const v1::Schedule& schedule);

  // `schedule` with the Pareto curve and the timeline only when asked (tasks
  // and job results carry neither).
  static v1::Schedule Trim(v1::Schedule schedule, bool include_pareto,
                           bool include_timeline);

 private:
  struct Hot {
    std::shared_ptr<const v1::Schedule> full;
    std::shared_ptr<const v1::Schedule> bare;
  };
  static v1::Schedule View(const Hot& hot, bool include_pareto,
                           bool include_timeline);
  Hot Remember(const std::string& key_text, v1::Schedule schedule);
  absl::StatusOr<std::optional<v1::Schedule>> Lookup(
      const storage::ScheduleCacheKey& key, bool include_pareto,
      bool include_timeline, bool count);

  storage::Store* store_;
  ServerMetrics* metrics_;
  absl::Mutex put_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Hot> hot_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_SCHEDULE_CACHE_H_
