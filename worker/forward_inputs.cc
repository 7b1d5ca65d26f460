#include "worker/forward_inputs.h"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/forward_binding.h"
#include "common/status_macros.h"

namespace mutwo::worker {
namespace {

// forward's arguments, self excluded.
std::vector<c10::Argument> ForwardArguments(const torch::jit::Module& module) {
  auto forward = module.find_method("forward");
  if (!forward.has_value()) return {};
  const auto& arguments = forward->function().getSchema().arguments();
  return std::vector<c10::Argument>(arguments.begin() + 1, arguments.end());
}

// The arguments as common/forward_binding.h reads them (from the archive's
// code at submit): the binding and its messages are that one
// implementation's.
std::vector<ForwardArgument> PlainArguments(
    const std::vector<c10::Argument>& arguments) {
  std::vector<ForwardArgument> plain;
  for (const c10::Argument& argument : arguments) {
    ForwardArgument a;
    a.name = argument.name();
    a.type = argument.type()->annotation_str();
    if (argument.default_value().has_value()) {
      std::ostringstream text;
      text << *argument.default_value();
      a.default_value = text.str();
    } else if (argument.type()->kind() == c10::TypeKind::OptionalType &&
               !absl::StartsWith(a.type, "Optional[")) {
      // Spelled otherwise (`Tensor?`): still Optional, None when left out.
      a.type = absl::StrCat("Optional[", a.type, "]");
    }
    plain.push_back(std::move(a));
  }
  return plain;
}

}  // namespace

std::string ForwardSignature(const torch::jit::Module& module) {
  return mutwo::ForwardSignature(PlainArguments(ForwardArguments(module)));
}

absl::StatusOr<ForwardBinding> BindForwardInputs(
    const torch::jit::Module& module,
    const std::vector<v1::TensorSpec>& specs) {
  const std::vector<c10::Argument> arguments = ForwardArguments(module);
  MUTWO_ASSIGN_OR_RETURN(
      const std::vector<int> spec_at,
      BindSpecsToArguments(PlainArguments(arguments), specs));
  ForwardBinding binding;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (spec_at[i] >= 0) {
      binding.inputs.push_back(specs[spec_at[i]]);
      continue;
    }
    binding.omitted.push_back(
        {static_cast<int>(i), arguments[i].name(),
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
