// Command-line parsing shared by the three binaries. Flags are Abseil flags
// (ABSL_FLAG in the file that uses them); this parser feeds them so that
// - `--help`/`-h` and `--version` are reported (ParsedArgs::help, ::version)
//   for the caller to act on,
// - a bad or unknown flag is an InvalidArgument naming it (callers exit 2),
// - flags named in `repeated` may appear many times (`--input a --input b`);
//   their values are collected in order instead of overwriting each other,
// - the names of the flags given are kept, so that a command table
//   (common/command_table.h) can refuse flags that do not apply.
// Both `--name=value` and `--name value` are accepted; booleans take
// `--name`, `--noname` or `--name=true|false`. A one-letter `-x` is accepted
// only where `short_names` maps it to a flag (`-o` for `--svg`).
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
  // Names (without dashes, as defined) of every flag given, in order; a
  // flag given twice is listed twice.
  std::vector<std::string> flags;
  bool help = false;
  bool version = false;

  // Values of a repeated flag (empty when absent).
  const std::vector<std::string>& Repeated(const std::string& name) const;
  // Whether `name` was given on the command line.
  bool Given(absl::string_view name) const;
};

struct ParseOptions {
  // Flags that may be given several times (values in ParsedArgs::repeated).
  std::set<std::string> repeated;
  // One-letter short names: {"o", "svg"} makes `-o FILE` mean `--svg FILE`.
  std::map<std::string, std::string> short_names;
};

// Parses argv[first..argc). Unknown flags and bad values are errors.
// `repeated` and `short_names` as in ParseOptions.
[[nodiscard]] absl::StatusOr<ParsedArgs> ParseArgs(
    int argc, char** argv, int first, const std::set<std::string>& repeated,
    const std::map<std::string, std::string>& short_names = {});

// One help entry per flag, aligned and wrapped to 80 columns:
// `  --name  help (default: value)`. The default is left out when it is
// empty, false, or the help already names it; `help_overrides` replaces a
// flag's own help (a flag shared by commands that use it differently);
// `short_names` as in ParseOptions (`-o, --svg`). Flags not defined are
// skipped. `with_help_and_version` adds --help and --version.
std::string FlagLines(const std::vector<std::string>& names,
                      const std::map<std::string, std::string>& help_overrides,
                      const std::map<std::string, std::string>& short_names,
                      bool with_help_and_version);

// `usage` followed by every flag defined in this project's sources (not
// Abseil's own), as FlagLines.
std::string UsageWithFlags(absl::string_view usage);

// `PROGRAM VERSION (planner PLANNER_VERSION)`, common/version.h.
std::string VersionLine(absl::string_view program);

// Exit codes shared by the CLIs (documented in README).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // the operation failed
inline constexpr int kExitBadInput = 2;     // bad arguments or input files
inline constexpr int kExitInfeasible = 3;   // no schedule fits the budget
inline constexpr int kExitUnavailable = 4;  // server unreachable / deadline
// Ctrl-C ended what the command waited for (128 + SIGINT, as a shell
// reports a process SIGINT killed).
inline constexpr int kExitInterrupted = 130;

}  // namespace mutwo

#endif  // MUTWO_COMMON_ARGS_H_
