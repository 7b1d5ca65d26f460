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

#define MUTWO_LOG(level, ...) ::spdlog::level(__VA_ARGS__)

#endif  // MUTWO_COMMON_LOGGING_H_
