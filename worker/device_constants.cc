#include "worker/device_constants.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <set>

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

}  // namespace

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
  }
  out.from.assign(from.begin(), from.end());
  return out;
}

}  // namespace mutwo::worker
