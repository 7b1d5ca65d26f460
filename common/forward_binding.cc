#include "common/forward_binding.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mutwo {

bool CanBeLeftOut(const ForwardArgument& argument) {
  return argument.default_value.has_value() ||
         absl::StartsWith(argument.type, "Optional[");
}

std::string ForwardSignature(const std::vector<ForwardArgument>& arguments) {
  std::vector<std::string> parts;
  for (const ForwardArgument& argument : arguments) {
    std::string text = absl::StrCat(argument.name, ": ", argument.type);
    if (argument.default_value.has_value()) {
      absl::StrAppend(&text, " = ", *argument.default_value);
    }
    parts.push_back(std::move(text));
  }
  return absl::StrCat("forward(", absl::StrJoin(parts, ", "), ")");
}

absl::StatusOr<std::vector<int>> BindSpecsToArguments(
    const std::vector<ForwardArgument>& arguments,
    const std::vector<v1::TensorSpec>& specs) {
  const int n = static_cast<int>(arguments.size());
  if (static_cast<int>(specs.size()) > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward takes ", n, " inputs, got ", specs.size(),
                     " --input specs: ", ForwardSignature(arguments)));
  }
  absl::flat_hash_map<std::string, int> position_of;
  for (int i = 0; i < n; ++i) position_of[arguments[i].name] = i;
  int named = 0;
  for (const v1::TensorSpec& spec : specs) {
    named += position_of.contains(spec.name()) ? 1 : 0;
  }
  std::vector<int> spec_at(n, -1);
  if (named == 0) {
    // No spec names an argument: by position.
    for (int i = 0; i < static_cast<int>(specs.size()); ++i) spec_at[i] = i;
  } else {
    for (int s = 0; s < static_cast<int>(specs.size()); ++s) {
      auto it = position_of.find(specs[s].name());
      if (it == position_of.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--input ", specs[s].name(), " names no argument of ",
            ForwardSignature(arguments),
            " (specs are matched by name when any names an argument)"));
      }
      if (spec_at[it->second] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "two --input specs for forward's argument ", specs[s].name()));
      }
      spec_at[it->second] = s;
    }
  }
  for (int i = 0; i < n; ++i) {
    if (spec_at[i] < 0 && !CanBeLeftOut(arguments[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward's argument ", arguments[i].name, " (", arguments[i].type,
          ") has no --input spec and no default: give --input ",
          arguments[i].name, ":DTYPE[DIMS] (", ForwardSignature(arguments),
          ")"));
    }
  }
  return spec_at;
}

}  // namespace mutwo
