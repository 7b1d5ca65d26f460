#include "worker/forward_inputs.h"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mutwo::worker {
namespace {

// forward's arguments, self excluded.
std::vector<c10::Argument> ForwardArguments(const torch::jit::Module& module) {
  auto forward = module.find_method("forward");
  if (!forward.has_value()) return {};
  const auto& arguments = forward->function().getSchema().arguments();
  return std::vector<c10::Argument>(arguments.begin() + 1, arguments.end());
}

bool CanBeLeftOut(const c10::Argument& argument) {
  return argument.default_value().has_value() ||
         argument.type()->kind() == c10::TypeKind::OptionalType;
}

std::string ArgumentText(const c10::Argument& argument) {
  std::ostringstream out;
  out << argument.name() << ": " << argument.type()->annotation_str();
  if (argument.default_value().has_value()) {
    out << " = " << *argument.default_value();
  }
  return out.str();
}

}  // namespace

std::string ForwardSignature(const torch::jit::Module& module) {
  std::vector<std::string> parts;
  for (const c10::Argument& argument : ForwardArguments(module)) {
    parts.push_back(ArgumentText(argument));
  }
  return absl::StrCat("forward(", absl::StrJoin(parts, ", "), ")");
}

absl::StatusOr<ForwardBinding> BindForwardInputs(
    const torch::jit::Module& module,
    const std::vector<v1::TensorSpec>& specs) {
  const std::vector<c10::Argument> arguments = ForwardArguments(module);
  const int n = static_cast<int>(arguments.size());
  if (static_cast<int>(specs.size()) > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward takes ", n, " inputs, got ", specs.size(),
                     " --input specs: ", ForwardSignature(module)));
  }
  absl::flat_hash_map<std::string, int> position_of;
  for (int i = 0; i < n; ++i) position_of[arguments[i].name()] = i;
  int named = 0;
  for (const v1::TensorSpec& spec : specs) {
    named += position_of.contains(spec.name()) ? 1 : 0;
  }
  // The spec of each argument position (-1: none).
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
            ForwardSignature(module),
            " (specs are matched by name when any names an argument)"));
      }
      if (spec_at[it->second] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "two --input specs for forward's argument ", specs[s].name()));
      }
      spec_at[it->second] = s;
    }
  }
  ForwardBinding binding;
  for (int i = 0; i < n; ++i) {
    if (spec_at[i] >= 0) {
      binding.inputs.push_back(specs[spec_at[i]]);
      continue;
    }
    if (!CanBeLeftOut(arguments[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward's argument ", arguments[i].name(), " (",
                       arguments[i].type()->annotation_str(),
                       ") has no --input spec and no default: give --input ",
                       arguments[i].name(), ":DTYPE[DIMS] (",
                       ForwardSignature(module), ")"));
    }
    binding.omitted.push_back(
        {i, arguments[i].name(),
         arguments[i].default_value().value_or(c10::IValue())});
  }
  return binding;
}

void BindOmittedArguments(std::shared_ptr<torch::jit::Graph>& graph,
                          const std::vector<OmittedArgument>& omitted) {
  if (omitted.empty()) return;
  torch::jit::WithInsertPoint guard(graph->block()->nodes().front());
  // From the last, so that the positions of the others hold.
  std::vector<OmittedArgument> last_first = omitted;
  std::sort(
      last_first.begin(), last_first.end(),
      [](const auto& a, const auto& b) { return a.position > b.position; });
  for (const OmittedArgument& argument : last_first) {
    const size_t input = static_cast<size_t>(argument.position) + 1;
    torch::jit::Value* constant = graph->insertConstant(argument.value);
    graph->inputs()[input]->replaceAllUsesWith(constant);
    graph->eraseInput(input);
  }
  torch::jit::ConstantPropagationImmutableTypes(graph);
  torch::jit::EliminateDeadCode(graph);
}

}  // namespace mutwo::worker
