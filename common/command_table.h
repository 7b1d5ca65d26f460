// The commands of a multi-command binary (`mutwo`, `mutwo-worker`) and the
// flags each one takes: one table per binary, so that help, dispatch and
// flag checking cannot disagree.
//
// CommandTable::Run parses argv (common/args.h) and then
// - `PROG --help` lists the commands and the global flags; `PROG COMMAND
//   --help` and `PROG help COMMAND` print that command's usage and only the
//   flags it takes, exit 0;
// - `PROG --version` prints VersionLine (and `version_extra`), exit 0;
// - a flag the command does not take is refused with exit 2 and a line
//   naming the flag and the command (`--wait does not apply to "plan"`);
// - otherwise `before_run` (shared checks: --output, logging) and the
//   command run; their exit code is returned.
// Validate() checks the table against the flags linked into the binary:
// every flag named exists, and every project flag is taken by some command
// (a flag nobody can pass is a bug). Run refuses to start (exit 1) when it
// fails, so every binary test catches a table that drifted.
// Not thread-safe; build one per process.
#ifndef MUTWO_COMMON_COMMAND_TABLE_H_
#define MUTWO_COMMON_COMMAND_TABLE_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/args.h"

namespace mutwo {

struct CommandSpec {
  std::string name;
  // What follows the command name in the usage line, e.g.
  // "PROFILE.json --budget B [flags]".
  std::string synopsis;
  // One line for the command list; more lines for `COMMAND --help`.
  std::string summary;
  std::string details;
  // Flags this command takes, besides the table's global flags.
  std::vector<std::string> flags;
  // Help text for a flag when this command uses it differently from the
  // flag's own help (`--batch`: several sizes for submit, one for profile).
  std::map<std::string, std::string> flag_help;
  std::function<int(const ParsedArgs&)> run;
};

struct CommandTableOptions {
  std::string program;      // "mutwo"
  std::string description;  // first line of `PROG --help`
  std::string footer;       // last lines of every help (exit codes)
  // Flags every command takes (--output, --log_level).
  std::vector<std::string> global_flags;
  ParseOptions parse;
  // Printed after the version line by --version (e.g. the LibTorch version).
  std::function<std::string()> version_extra;
  // Runs after the flags were checked, before the command; a non-OK status
  // is printed as `PROG COMMAND: message` and exits 2.
  std::function<absl::Status(const CommandSpec&)> before_run;
};

class CommandTable {
 public:
  CommandTable(CommandTableOptions options, std::vector<CommandSpec> commands);

  [[nodiscard]] absl::Status Validate() const;
  // `PROG --help`: commands, global flags, footer.
  std::string Usage() const;
  // `PROG COMMAND --help`; NotFound for an unknown command.
  [[nodiscard]] absl::StatusOr<std::string> CommandUsage(
      const std::string& name) const;
  // Parses argv[1..) and dispatches; returns the exit code.
  int Run(int argc, char** argv) const;

 private:
  const CommandSpec* Find(const std::string& name) const;

  CommandTableOptions options_;
  std::vector<CommandSpec> commands_;
};

}  // namespace mutwo

#endif  // MUTWO_COMMON_COMMAND_TABLE_H_
