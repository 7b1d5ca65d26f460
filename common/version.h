// Build facts shared by the binaries and the metrics (`mutwo_build_info`).
#ifndef MUTWO_COMMON_VERSION_H_
#define MUTWO_COMMON_VERSION_H_

namespace mutwo {

inline constexpr char kVersion[] = "0.1.0";
// Bumped whenever the planner's decisions for the same profile may change;
// part of the schedule cache key.
inline constexpr char kPlannerVersion[] = "mutwo-planner-3";

}  // namespace mutwo

#endif  // MUTWO_COMMON_VERSION_H_
