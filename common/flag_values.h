// Values of enum-like flags (--output, --state, --kind, --device_kind, ...):
// matched without regard to case, so `--output JSON`, `--state succeeded`
// and `--policy SQRT_N` all work; an error names the flag and lists the
// choices. Stateless and thread-safe.
#ifndef MUTWO_COMMON_FLAG_VALUES_H_
#define MUTWO_COMMON_FLAG_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mutwo {

// The choice `value` names (spelled as in `choices`), or InvalidArgument:
// `--output "xml": use text or json`.
[[nodiscard]] absl::StatusOr<std::string> ParseChoice(
    absl::string_view flag, absl::string_view value,
    const std::vector<std::string>& choices);

// `a, b or c`.
std::string JoinChoices(const std::vector<std::string>& choices);

// A job's device kind: "cpu", "cuda" or "" (any worker), any case.
[[nodiscard]] absl::StatusOr<std::string> ParseDeviceKind(
    absl::string_view flag, absl::string_view value);

// A memory size flag (--capacity, --memory_limit, --task_memory_limit,
// --max_model_bytes): a number with a unit as ParseBytes reads it (`80GiB`,
// `4000MB`, `512B`). A bare number is refused as ambiguous, as budgets are:
// `--capacity "80": a bare number is ambiguous; say 80GiB, 80GB or 80B`.
[[nodiscard]] absl::StatusOr<int64_t> ParseMemorySize(absl::string_view flag,
                                                      absl::string_view value);

}  // namespace mutwo

#endif  // MUTWO_COMMON_FLAG_VALUES_H_
