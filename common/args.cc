#include "common/args.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/version.h"

namespace mutwo {
namespace {

bool IsBoolFlag(const absl::CommandLineFlag& flag) {
  return flag.IsOfType<bool>();
}

bool IsProjectFlag(const absl::CommandLineFlag& flag) {
  const std::string file = flag.Filename();
  return !absl::StrContains(file, "absl/") &&
         !absl::StrContains(file, "absl\\");
}

}  // namespace

const std::vector<std::string>& ParsedArgs::Repeated(
    const std::string& name) const {
  static const std::vector<std::string>* const kEmpty =
      new std::vector<std::string>();
  auto it = repeated.find(name);
  return it == repeated.end() ? *kEmpty : it->second;
}

bool ParsedArgs::Given(absl::string_view name) const {
  return std::find(flags.begin(), flags.end(), name) != flags.end();
}

absl::StatusOr<ParsedArgs> ParseArgs(
    int argc, char** argv, int first, const std::set<std::string>& repeated,
    const std::map<std::string, std::string>& short_names) {
  ParsedArgs out;
  bool only_positional = false;
  for (int i = first; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (only_positional || arg == "-" || !absl::StartsWith(arg, "-")) {
      out.positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help" ||
        arg == "--helpfull") {
      out.help = true;
      continue;
    }
    if (arg == "--version" || arg == "-version") {
      out.version = true;
      continue;
    }
    absl::string_view body = arg;
    const bool long_form = absl::ConsumePrefix(&body, "--");
    if (!long_form) absl::ConsumePrefix(&body, "-");
    std::string name(body), value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      name = std::string(body.substr(0, eq));
      value = std::string(body.substr(eq + 1));
      has_value = true;
    }
    if (name.size() == 1) {
      // One letter: only a declared short name (`-o`), never a flag that
      // happens to be called `o`.
      auto it = short_names.find(name);
      if (long_form || it == short_names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown flag \"", long_form ? "--" : "-", name, "\"; see --help"));
      }
      name = it->second;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no") && !has_value) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && IsBoolFlag(*flag)) {
        negated = true;
        name = name.substr(2);
      } else {
        flag = nullptr;
      }
    }
    if (flag == nullptr || !IsProjectFlag(*flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag \"--", name, "\"; see --help"));
    }
    if (IsBoolFlag(*flag) && !has_value) {
      value = negated ? "false" : "true";
      has_value = true;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag \"--", name, "\" needs a value"));
      }
      value = argv[++i];
    }
    out.flags.push_back(name);
    if (repeated.count(name) > 0) {
      out.repeated[name].push_back(value);
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag \"--", name, "\": bad value \"", value, "\": ", error));
    }
  }
  return out;
}

namespace {

constexpr size_t kHelpWidth = 80;

// `words` wrapped to lines of at most kHelpWidth columns, every line after
// the first indented by `indent`.
std::string Wrap(absl::string_view words, size_t indent) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(words, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > kHelpWidth) {
      absl::StrAppend(&out, line, "\n", std::string(indent, ' '));
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  return absl::StrCat(out, line);
}

}  // namespace

std::string FlagLines(const std::vector<std::string>& names,
                      const std::map<std::string, std::string>& help_overrides,
                      const std::map<std::string, std::string>& short_names,
                      bool with_help_and_version) {
  std::map<std::string, std::string> short_of;
  for (const auto& [letter, name] : short_names) short_of[name] = letter;
  std::vector<std::pair<std::string, std::string>> rows;  // label, help
  for (const std::string& name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    auto s = short_of.find(name);
    std::string label = s == short_of.end()
                            ? absl::StrCat("--", name)
                            : absl::StrCat("-", s->second, ", --", name);
    auto o = help_overrides.find(name);
    std::string help = o != help_overrides.end() ? o->second : flag->Help();
    const std::string def = flag->DefaultValue();
    if (!def.empty() && !(IsBoolFlag(*flag) && def == "false") &&
        !absl::StrContains(help, "(default") &&
        !absl::StrContains(help, "(required")) {
      absl::StrAppend(&help, " (default: ", def, ")");
    }
    rows.emplace_back(std::move(label), std::move(help));
  }
  if (with_help_and_version) {
    rows.emplace_back("--help", "print this help");
    rows.emplace_back("--version", "print the version");
  }
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [label, help] : rows) {
    absl::StrAppend(&out, "  ", label,
                    std::string(width - label.size() + 2, ' '),
                    Wrap(help, width + 4), "\n");
  }
  return out;
}

std::string UsageWithFlags(absl::string_view usage) {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsProjectFlag(*flag)) names.push_back(std::string(flag->Name()));
  }
  std::sort(names.begin(), names.end());
  return absl::StrCat(usage, "\n\nFlags:\n",
                      FlagLines(names, {}, {}, /*with_help_and_version=*/true));
}

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", kVersion, " (planner ", kPlannerVersion,
                      ")");
}

}  // namespace mutwo
