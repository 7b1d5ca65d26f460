#include "common/command_table.h"

#include <algorithm>
#include <iostream>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mutwo {
namespace {

bool IsProjectFlag(const absl::CommandLineFlag& flag) {
  const std::string file = flag.Filename();
  return !absl::StrContains(file, "absl/") &&
         !absl::StrContains(file, "absl\\");
}

}  // namespace

CommandTable::CommandTable(CommandTableOptions options,
                           std::vector<CommandSpec> commands)
    : options_(std::move(options)), commands_(std::move(commands)) {}

const CommandSpec* CommandTable::Find(const std::string& name) const {
  for (const CommandSpec& c : commands_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

absl::Status CommandTable::Validate() const {
  std::set<std::string> taken(options_.global_flags.begin(),
                              options_.global_flags.end());
  for (const CommandSpec& c : commands_)
    taken.insert(c.flags.begin(), c.flags.end());
  for (const auto& [letter, name] : options_.parse.short_names) {
    taken.insert(name);
  }
  for (const std::string& name : taken) {
    if (absl::FindCommandLineFlag(name) == nullptr) {
      return absl::InternalError(
          absl::StrCat(options_.program, ": the command table names --", name,
                       ", which is not defined in this binary"));
    }
  }
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsProjectFlag(*flag) && taken.count(std::string(name)) == 0) {
      return absl::InternalError(
          absl::StrCat(options_.program, ": --", name, " (", flag->Filename(),
                       ") is defined but no command takes it"));
    }
  }
  return absl::OkStatus();
}

std::string CommandTable::Usage() const {
  std::string out = absl::StrCat(
      options_.description, "\n\nUsage: ", options_.program,
      " COMMAND [ARGS] [flags]\n       ", options_.program,
      " help COMMAND (or COMMAND --help): one command's flags\n\nCommands:\n");
  size_t width = 0;
  for (const CommandSpec& c : commands_) width = std::max(width, c.name.size());
  for (const CommandSpec& c : commands_) {
    absl::StrAppend(&out, "  ", c.name,
                    std::string(width - c.name.size() + 2, ' '), c.summary,
                    "\n");
  }
  absl::StrAppend(&out, "\nGlobal flags:\n",
                  FlagLines(options_.global_flags, {}, {},
                            /*with_help_and_version=*/true));
  if (!options_.footer.empty())
    absl::StrAppend(&out, "\n", options_.footer, "\n");
  return out;
}

absl::StatusOr<std::string> CommandTable::CommandUsage(
    const std::string& name) const {
  const CommandSpec* c = Find(name);
  if (c == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "unknown command \"", name, "\"; see ", options_.program, " --help"));
  }
  std::string out = absl::StrCat("Usage: ", options_.program, " ", c->name,
                                 c->synopsis.empty() ? "" : " ", c->synopsis,
                                 "\n\n", c->summary, "\n");
  if (!c->details.empty()) absl::StrAppend(&out, c->details, "\n");
  if (!c->flags.empty()) {
    absl::StrAppend(
        &out, "\nFlags:\n",
        FlagLines(c->flags, c->flag_help, options_.parse.short_names,
                  /*with_help_and_version=*/false));
  }
  if (!options_.global_flags.empty()) {
    absl::StrAppend(&out, "\nGlobal flags:\n",
                    FlagLines(options_.global_flags, c->flag_help, {},
                              /*with_help_and_version=*/false));
  }
  if (!options_.footer.empty())
    absl::StrAppend(&out, "\n", options_.footer, "\n");
  return out;
}

int CommandTable::Run(int argc, char** argv) const {
  const std::string& prog = options_.program;
  if (absl::Status s = Validate(); !s.ok()) {
    std::cerr << s.message() << "\n";
    return kExitFailure;
  }
  auto args = ParseArgs(argc, argv, 1, options_.parse.repeated,
                        options_.parse.short_names);
  if (!args.ok()) {
    std::cerr << prog << ": " << args.status().message() << "\n";
    return kExitBadInput;
  }
  if (args->version) {
    std::cout << VersionLine(prog) << "\n";
    if (options_.version_extra) std::cout << options_.version_extra();
    return kExitOk;
  }
  std::vector<std::string>& positional = args->positional;
  // `PROG help [COMMAND]` is `PROG [COMMAND] --help`.
  if (!positional.empty() && positional.front() == "help") {
    positional.erase(positional.begin());
    args->help = true;
  }
  if (positional.empty()) {
    (args->help ? std::cout : std::cerr) << Usage();
    return args->help ? kExitOk : kExitBadInput;
  }
  const std::string name = positional.front();
  const CommandSpec* command = Find(name);
  if (command == nullptr) {
    std::cerr << prog << ": unknown command \"" << name << "\"; see " << prog
              << " --help\n";
    return kExitBadInput;
  }
  if (args->help) {
    std::cout << *CommandUsage(name);
    return kExitOk;
  }
  for (const std::string& flag : args->flags) {
    const bool global =
        std::find(options_.global_flags.begin(), options_.global_flags.end(),
                  flag) != options_.global_flags.end();
    const bool taken = std::find(command->flags.begin(), command->flags.end(),
                                 flag) != command->flags.end();
    if (!global && !taken) {
      std::cerr << prog << " " << name << ": --" << flag
                << " does not apply to \"" << name << "\"; " << prog << " "
                << name << " --help lists its flags\n";
      return kExitBadInput;
    }
  }
  if (options_.before_run) {
    if (absl::Status s = options_.before_run(*command); !s.ok()) {
      std::cerr << prog << " " << name << ": " << s.message() << "\n";
      return kExitBadInput;
    }
  }
  positional.erase(positional.begin());
  return command->run(*args);
}

}  // namespace mutwo
