// RetargetDeviceConstants on a traced model: the numbers of a trace's shape
// arithmetic run on the CPU with the shapes, the other constants stay on
// the device they were loaded to. No second device here: "meta" stands in
// for the accelerator torch::jit::load(..., device) moves constants to.
#include "worker/device_constants.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "tests/worker/test_models.h"

namespace mutwo::worker {
namespace {

// Every node of every function of `module`'s compilation unit.
void ForEachNode(torch::jit::Module& module,
                 const std::function<void(torch::jit::Node*)>& fn) {
  std::function<void(torch::jit::Block*)> walk = [&](torch::jit::Block* b) {
    for (torch::jit::Node* node : b->nodes()) {
      for (torch::jit::Block* sub : node->blocks()) walk(sub);
      fn(node);
    }
  };
  for (torch::jit::Function* f :
       module._ivalue()->compilation_unit()->get_functions()) {
    if (f->isGraphFunction()) {
      walk(torch::jit::toGraphFunction(*f).graph()->block());
    }
  }
}

bool IsTensorConstant(const torch::jit::Node* node) {
  return node->kind() == c10::prim::Constant &&
         node->hasAttribute(c10::attr::value) &&
         node->kindOf(c10::attr::value) == torch::jit::AttributeKind::t;
}

TEST(DeviceConstantsTest, ATracesShapeArithmeticIsFound) {
  torch::jit::Module module =
      torch::jit::load(testing::ModelPath("traced_shape_arithmetic"));
  // What loading to an accelerator does to the trace's tensor constants
  // (meta tensors have no data: RetargetDeviceConstants cannot copy them
  // back, so this test checks which constants it would move).
  int moved_to_meta = 0;
  ForEachNode(module, [&](torch::jit::Node* node) {
    if (!IsTensorConstant(node)) return;
    node->t_(c10::attr::value,
             node->t(c10::attr::value).to(torch::Device("meta")));
    ++moved_to_meta;
  });
  ASSERT_GE(moved_to_meta, 2);

  std::vector<ConstantUse> uses;
  for (torch::jit::Function* f :
       module._ivalue()->compilation_unit()->get_functions()) {
    if (!f->isGraphFunction()) continue;
    for (const ConstantUse& use : ShapeArithmeticConstants(
             torch::jit::toGraphFunction(*f).graph()->block())) {
      uses.push_back(use);
    }
  }
  // `b *= 2` on the batch size: its 2 is found.
  const auto is_mul_ = [](const ConstantUse& u) {
    return u.node->kind() == c10::Symbol::fromQualString("aten::mul_") &&
           u.input == 1;
  };
  EXPECT_EQ(std::count_if(uses.begin(), uses.end(), is_mul_), 1);
  for (const ConstantUse& use : uses) {
    const torch::jit::Node* c = use.node->input(use.input)->node();
    ASSERT_TRUE(IsTensorConstant(c)) << *use.node;
    // Integers of shapes only: the 0.5 added to an activation stays where
    // the activation is.
    EXPECT_FALSE(c->t(c10::attr::value).is_floating_point()) << *use.node;
    EXPECT_EQ(c->t(c10::attr::value).dim(), 0) << *use.node;
  }
}

TEST(DeviceConstantsTest, OnTheCpuNothingMoves) {
  torch::jit::Module module =
      torch::jit::load(testing::ModelPath("traced_shape_arithmetic"));
  const RetargetedDevices out =
      RetargetDeviceConstants(module, torch::Device("cpu"));
  EXPECT_EQ(out.shape_constants, 0);
  EXPECT_EQ(out.constants, 0);
}

}  // namespace
}  // namespace mutwo::worker
