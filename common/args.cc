#include "common/args.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

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

absl::StatusOr<ParsedArgs> ParseArgs(int argc, char** argv, int first,
                                     const std::set<std::string>& repeated) {
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
    absl::string_view body = arg;
    if (!absl::ConsumePrefix(&body, "--")) absl::ConsumePrefix(&body, "-");
    std::string name(body), value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      name = std::string(body.substr(0, eq));
      value = std::string(body.substr(eq + 1));
      has_value = true;
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

std::string UsageWithFlags(absl::string_view usage) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsProjectFlag(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::string out = absl::StrCat(usage, "\n\nFlags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&out, "  --", flag->Name(), "  ", flag->Help(),
                    " (default: \"", flag->DefaultValue(), "\")\n");
  }
  return out;
}

}  // namespace mutwo
