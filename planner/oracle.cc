#include "planner/oracle.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace mutwo::planner {

absl::StatusOr<OracleResult> SolveExactly(const Simulator& simulator,
                                          int64_t budget_bytes) {
  const int n = static_cast<int>(simulator.profile().activations.size());
  if (n > kOracleMaxCandidates) {
    return absl::InvalidArgumentError(
        absl::StrCat("the exact solver takes at most ", kOracleMaxCandidates,
                     " activations; this profile has ", n));
  }
  OracleResult best;
  best.floor_bytes = std::numeric_limits<int64_t>::max();
  Decisions d(n);
  const uint32_t subsets = 1u << n;
  for (uint32_t mask = 0; mask < subsets; ++mask) {
    for (int i = 0; i < n; ++i) {
      d[i].action = (mask >> i) & 1u ? Action::kRecompute : Action::kRetain;
    }
    SimResult r = simulator.Run(d);
    ++best.schedules_simulated;
    best.floor_bytes = std::min(best.floor_bytes, r.peak_bytes);
    if (r.peak_bytes > budget_bytes) continue;
    if (!best.feasible || r.iteration_ms < best.sim.iteration_ms) {
      best.feasible = true;
      best.decisions = d;
      best.sim = std::move(r);
    }
  }
  return best;
}

}  // namespace mutwo::planner
