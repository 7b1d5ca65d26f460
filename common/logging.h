// Logging: spdlog to stderr (stdout is kept for results, e.g. --output=json).
// Call InitLogging once from main; then use MUTWO_LOG(info, "x={}", x).
#ifndef MUTWO_COMMON_LOGGING_H_
#define MUTWO_COMMON_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace mutwo {

// `level`: trace, debug, info, warn, error, off.
[[nodiscard]] absl::Status InitLogging(absl::string_view program,
                                       absl::string_view level);

}  // namespace mutwo

namespace mutwo::logging_internal {
// Whether MUTWO_LOG(level, ...) writes: its arguments are evaluated only
// then (a trace line per forward node once read the allocator's statistics
// twice per node with tracing off).
inline bool On_trace() { return spdlog::should_log(spdlog::level::trace); }
inline bool On_debug() { return spdlog::should_log(spdlog::level::debug); }
inline bool On_info() { return spdlog::should_log(spdlog::level::info); }
inline bool On_warn() { return spdlog::should_log(spdlog::level::warn); }
inline bool On_error() { return spdlog::should_log(spdlog::level::err); }
inline bool On_critical() {
  return spdlog::should_log(spdlog::level::critical);
}
}  // namespace mutwo::logging_internal

#define MUTWO_LOG(level, ...)                      \
  do {                                             \
    if (::mutwo::logging_internal::On_##level()) { \
      ::spdlog::level(__VA_ARGS__);                \
    }                                              \
  } while (false)

#endif  // MUTWO_COMMON_LOGGING_H_
