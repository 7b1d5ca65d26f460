#include "server/schedule_cache.h"

#include <utility>

#include "common/status_macros.h"

namespace mutwo {

v1::Schedule ScheduleCache::Trim(v1::Schedule schedule, bool include_pareto,
                                 bool include_timeline) {
  if (!include_pareto) schedule.clear_pareto();
  if (!include_timeline) schedule.clear_timeline();
  return schedule;
}

v1::Schedule ScheduleCache::View(const Hot& hot, bool include_pareto,
                                 bool include_timeline) {
  if (include_pareto && include_timeline) return *hot.full;
  if (!include_pareto && !include_timeline) return *hot.bare;
  v1::Schedule s = *hot.full;
  if (!include_pareto) s.clear_pareto();
  if (!include_timeline) s.clear_timeline();
  return s;
}

ScheduleCache::Hot ScheduleCache::Remember(const std::string& key_text,
                                           v1::Schedule schedule) {
  Hot hot;
  hot.bare = std::make_shared<const v1::Schedule>(
      Trim(schedule, /*include_pareto=*/false, /*include_timeline=*/false));
  hot.full = std::make_shared<const v1::Schedule>(std::move(schedule));
  absl::MutexLock lock(&mu_);
  if (hot_.size() >= kHotEntries) hot_.clear();
  hot_[key_text] = hot;
  return hot;
}

absl::StatusOr<std::optional<v1::Schedule>> ScheduleCache::Get(
    const storage::ScheduleCacheKey& key, bool include_pareto,
    bool include_timeline) {
  return Lookup(key, include_pareto, include_timeline, /*count=*/true);
}

absl::StatusOr<std::optional<v1::Schedule>> ScheduleCache::Peek(
    const storage::ScheduleCacheKey& key) {
  return Lookup(key, /*include_pareto=*/true, /*include_timeline=*/true,
                /*count=*/false);
}

absl::StatusOr<std::optional<v1::Schedule>> ScheduleCache::Lookup(
    const storage::ScheduleCacheKey& key, bool include_pareto,
    bool include_timeline, bool count) {
  const std::string key_text = storage::CanonicalKeyString(key);
  {
    absl::MutexLock lock(&mu_);
    auto it = hot_.find(key_text);
    if (it != hot_.end()) {
      if (count) metrics_->CountCache(true);
      return View(it->second, include_pareto, include_timeline);
    }
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> stored,
                         store_->GetCachedSchedule(key));
  if (count) metrics_->CountCache(stored.has_value());
  if (!stored.has_value()) return std::nullopt;
  return View(Remember(key_text, *std::move(stored)), include_pareto,
              include_timeline);
}

absl::Status ScheduleCache::Put(const storage::ScheduleCacheKey& key,
                                const std::string& job_id,
                                const v1::Schedule& schedule) {
  // One writer at a time, so that the memory copy ends as the stored row.
  absl::MutexLock lock(&put_mu_);
  MUTWO_RETURN_IF_ERROR(store_->PutSchedule(key, job_id, schedule));
  Remember(storage::CanonicalKeyString(key), schedule);
  return absl::OkStatus();
}

}  // namespace mutwo
