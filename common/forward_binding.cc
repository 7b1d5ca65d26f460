#include "common/forward_binding.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"

namespace mutwo {
namespace {

// Whether a tensor can be passed for an argument of this TorchScript type.
// An --input spec always makes a tensor (worker/inputs.h; a spec without
// dims makes a 0-dim one), so an argument declared int, float, bool, str or
// a container cannot take one: the worker's first forward would fail with
// TorchScript's "Expected a value of type 'int' for argument", far from the
// flag that caused it.
bool TakesTensor(const std::string& type) {
  return type == "Tensor" || type == "Optional[Tensor]" || type == "Any";
}

}  // namespace

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
    if (spec_at[i] >= 0 && !TakesTensor(arguments[i].type)) {
      const ForwardArgument& argument = arguments[i];
      const std::string what_to_do =
          CanBeLeftOut(argument)
              ? absl::StrCat("leave ", argument.name, " out (",
                             argument.default_value.has_value()
                                 ? absl::StrCat("its default is ",
                                                *argument.default_value)
                                 : "it is Optional: None",
                             ")")
              : absl::StrCat("give ", argument.name, " a default in forward");
      return absl::InvalidArgumentError(absl::StrCat(
          "--input ", FormatTensorSpec(specs[spec_at[i]]),
          " gives a tensor to forward's argument ", argument.name,
          ", declared ", argument.type,
          ": an --input spec is always a tensor; ", what_to_do,
          ", or declare it Tensor (", ForwardSignature(arguments), ")"));
    }
    if (spec_at[i] < 0 && !CanBeLeftOut(arguments[i]) &&
        !TakesTensor(arguments[i].type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward's argument ", arguments[i].name, " (", arguments[i].type,
          ") has no default, and an --input spec (always a tensor) cannot "
          "give it one: give ",
          arguments[i].name, " a default in forward, or declare it Tensor (",
          ForwardSignature(arguments), ")"));
    }
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
