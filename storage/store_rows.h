// Pieces shared by the Store's files (one per aggregate: store_models.cc,
// store_jobs.cc, store_tasks.cc, store_profiles.cc, store_schedules.cc,
// store_workers.cc): argument checks, ids, and turning a stored blob back
// into its proto. Internal to mutwo_storage.
#ifndef MUTWO_STORAGE_STORE_ROWS_H_
#define MUTWO_STORAGE_STORE_ROWS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::storage {

inline constexpr char kModelsDir[] = "models";

std::string Quote(absl::string_view text);

// InvalidArgument unless `sha256` is 64 lowercase hex digits (so it is safe
// in a path).
absl::Status ValidateSha256(absl::string_view sha256);
absl::Status RequireNonEmpty(absl::string_view value, absl::string_view what);
absl::Status ValidateBatchSize(int64_t batch_size);

// Sortable unique ids: `prefix-<13-digit ms>-<12 hex random>`.
std::string NewId(absl::string_view prefix, int64_t now_ms);

// SUCCEEDED, FAILED or CANCELLED.
bool IsFinished(v1::Job::State state);

// A stored blob parsed as `Proto`; DataLoss naming `what` when it does not
// parse (a corrupt row is reported, never a crash).
template <typename Proto>
absl::StatusOr<Proto> ParseRow(const std::string& blob,
                               absl::string_view what) {
  Proto proto;
  if (!proto.ParseFromString(blob)) {
    return absl::DataLossError(
        absl::StrCat(what, ": stored ", Proto::descriptor()->name(),
                     " does not parse (corrupt row, ", blob.size(), " bytes)"));
  }
  return proto;
}

// Counts per state from (state, count) rows, with every valid state except
// the unspecified one present (zero when no row has it). DataLoss for a
// state the enum does not have.
template <typename State>
absl::StatusOr<std::map<State, int64_t>> StateCounts(
    const std::vector<std::pair<int64_t, int64_t>>& rows,
    absl::string_view table, bool (*is_valid)(int), int min, int max) {
  std::map<State, int64_t> counts;
  for (int s = min; s <= max; ++s) {
    if (is_valid(s) && s != 0) counts[static_cast<State>(s)] = 0;
  }
  for (const auto& [state, count] : rows) {
    if (!is_valid(static_cast<int>(state))) {
      return absl::DataLossError(
          absl::StrCat(table, " table holds an invalid state ", state));
    }
    counts[static_cast<State>(state)] = count;
  }
  return counts;
}

}  // namespace mutwo::storage

#endif  // MUTWO_STORAGE_STORE_ROWS_H_
