// Exact retain/recompute search for small graphs: simulates every subset of
// recomputed activations (2^n schedules, n <= 20) and keeps the fastest one
// whose simulated peak fits the budget. Used by tests to measure the greedy
// policy's optimality gap; too slow for real models by design.
#ifndef MUTWO_PLANNER_ORACLE_H_
#define MUTWO_PLANNER_ORACLE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/simulator.h"

namespace mutwo::planner {

inline constexpr int kOracleMaxCandidates = 20;

struct OracleResult {
  bool feasible = false;
  Decisions decisions;
  SimResult sim;            // of `decisions` when feasible
  int64_t floor_bytes = 0;  // lowest peak over all subsets
  int64_t schedules_simulated = 0;
};

// Errors: InvalidArgument when the profile has more than
// kOracleMaxCandidates activations.
[[nodiscard]] absl::StatusOr<OracleResult> SolveExactly(
    const Simulator& simulator, int64_t budget_bytes);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_ORACLE_H_
