#include "worker/device_constants.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <set>
#include <unordered_set>

namespace mutwo::worker {
namespace {

void RetargetGraph(torch::jit::Block* block, const torch::Device& device,
                   RetargetedDevices* out, std::set<std::string>* from) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    torch::jit::Node* node = *it;
    ++it;  // the node may be destroyed below
    for (torch::jit::Block* sub : node->blocks()) {
      RetargetGraph(sub, device, out, from);
    }
    if (node->kind() != c10::prim::Constant || node->outputs().size() != 1 ||
        node->output()->type()->kind() != c10::TypeKind::DeviceObjType) {
      continue;
    }
    const c10::optional<c10::IValue> value =
        torch::jit::toIValue(node->output());
    if (!value.has_value() || !value->isDevice()) continue;
    const c10::Device named = value->toDevice();
    if (named == device) continue;
    torch::jit::WithInsertPoint guard(node);
    torch::jit::Value* replacement = node->owningGraph()->insertConstant(
        c10::IValue(device), c10::nullopt, node->scope());
    node->output()->replaceAllUsesWith(replacement);
    node->destroy();
    from->insert(named.str());
    ++out->constants;
  }
}

// A 0-dim tensor constant of the code (a number a trace met), or null.
const at::Tensor* ScalarTensorConstant(const torch::jit::Value* value) {
  const torch::jit::Node* node = value->node();
  if (node->kind() != c10::prim::Constant ||
      !node->hasAttribute(c10::attr::value) ||
      node->kindOf(c10::attr::value) != torch::jit::AttributeKind::t) {
    return nullptr;
  }
  const at::Tensor& t = node->t(c10::attr::value);
  return t.dim() == 0 ? &t : nullptr;
}

void CollectShapeArithmeticConstants(
    torch::jit::Block* block,
    std::unordered_set<const torch::jit::Value*>* shape,
    std::vector<ConstantUse>* uses) {
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* sub : node->blocks()) {
      CollectShapeArithmeticConstants(sub, shape, uses);
    }
    if (node->kind() == c10::prim::NumToTensor) {
      shape->insert(node->output());
      continue;
    }
    bool reads_shape = false;
    bool only_shapes = true;
    for (const torch::jit::Value* in : node->inputs()) {
      if (shape->count(in) > 0) {
        reads_shape = true;
      } else if (in->type()->kind() == c10::TypeKind::TensorType &&
                 ScalarTensorConstant(in) == nullptr) {
        only_shapes = false;
      }
    }
    if (!reads_shape) continue;
    for (size_t i = 0; i < node->inputs().size(); ++i) {
      if (ScalarTensorConstant(node->input(i)) != nullptr) {
        uses->push_back({node, i});
      }
    }
    if (!only_shapes) continue;
    for (const torch::jit::Value* o : node->outputs()) {
      if (o->type()->kind() == c10::TypeKind::TensorType) shape->insert(o);
    }
  }
}

// Puts the shape arithmetic's constants that are not on the CPU there
// (ShapeArithmeticConstants): a new CPU constant for each such read.
void KeepShapeConstantsOnCpu(torch::jit::Graph* graph, RetargetedDevices* out) {
  for (const ConstantUse& use : ShapeArithmeticConstants(graph->block())) {
    const at::Tensor* t = ScalarTensorConstant(use.node->input(use.input));
    if (t->device().is_cpu()) continue;
    torch::jit::WithInsertPoint guard(use.node);
    torch::jit::Value* on_cpu =
        graph->insertConstant(c10::IValue(t->cpu()), c10::nullopt,
                              use.node->input(use.input)->node()->scope());
    use.node->replaceInput(use.input, on_cpu);
    ++out->shape_constants;
  }
}

}  // namespace

std::vector<ConstantUse> ShapeArithmeticConstants(torch::jit::Block* block) {
  std::vector<ConstantUse> uses;
  std::unordered_set<const torch::jit::Value*> shape;
  CollectShapeArithmeticConstants(block, &shape, &uses);
  return uses;
}

RetargetedDevices RetargetDeviceConstants(torch::jit::Module& module,
                                          const torch::Device& device) {
  RetargetedDevices out;
  std::set<std::string> from;
  // Functions in name order (the compilation unit keeps them in insertion
  // order, which is the archive's): the rewrite is the same every run.
  std::vector<torch::jit::Function*> functions =
      module._ivalue()->compilation_unit()->get_functions();
  std::sort(functions.begin(), functions.end(),
            [](const torch::jit::Function* a, const torch::jit::Function* b) {
              return a->qualname().qualifiedName() <
                     b->qualname().qualifiedName();
            });
  for (torch::jit::Function* f : functions) {
    if (!f->isGraphFunction()) continue;
    std::shared_ptr<torch::jit::Graph> graph =
        torch::jit::toGraphFunction(*f).graph();
    RetargetGraph(graph->block(), device, &out, &from);
    KeepShapeConstantsOnCpu(graph.get(), &out);
  }
  out.from.assign(from.begin(), from.end());
  return out;
}

}  // namespace mutwo::worker
