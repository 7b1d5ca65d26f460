// Command-line parsing shared by the three binaries. Flags are Abseil flags
// (ABSL_FLAG in the file that uses them); this parser feeds them so that
// - `--help`/`-h` prints the usage and the binary's own flags and exits 0,
// - a bad or unknown flag is an InvalidArgument naming it (callers exit 2),
// - flags named in `repeated` may appear many times (`--input a --input b`);
//   their values are collected in order instead of overwriting each other.
// Both `--name=value` and `--name value` are accepted; booleans take
// `--name`, `--noname` or `--name=true|false`.
#ifndef MUTWO_COMMON_ARGS_H_
#define MUTWO_COMMON_ARGS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mutwo {

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> repeated;
  bool help = false;

  // Values of a repeated flag (empty when absent).
  const std::vector<std::string>& Repeated(const std::string& name) const;
};

// Parses argv[first..argc). Unknown flags and bad values are errors.
[[nodiscard]] absl::StatusOr<ParsedArgs> ParseArgs(
    int argc, char** argv, int first, const std::set<std::string>& repeated);

// `usage` followed by the flags defined in this project's sources (not
// Abseil's own), one per line with help text and default.
std::string UsageWithFlags(absl::string_view usage);

// Exit codes shared by the CLIs (documented in README).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // the operation failed
inline constexpr int kExitBadInput = 2;     // bad arguments or input files
inline constexpr int kExitInfeasible = 3;   // no schedule fits the budget
inline constexpr int kExitUnavailable = 4;  // server unreachable / deadline

}  // namespace mutwo

#endif  // MUTWO_COMMON_ARGS_H_
