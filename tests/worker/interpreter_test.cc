#include "worker/interpreter.h"

#include <gtest/gtest.h>

#include "common/parse.h"
#include "tests/worker/test_models.h"
#include "worker/inputs.h"
#include "worker/model_loader.h"

namespace mutwo::worker {
namespace {

using ::mutwo::testing::ModelPath;
using ::mutwo::testing::TestModel;

struct StepResult {
  double loss = 0;
  std::vector<torch::Tensor> grads;
};

class InterpreterTest : public ::testing::TestWithParam<TestModel> {};

// Loss and gradients of one step, through the module or the interpreter,
// with the same RNG seed (dropout draws the same masks).
StepResult Step(torch::jit::Module& module, Interpreter* interpreter,
                const std::vector<c10::IValue>& inputs,
                const v1::LossSpec& loss_spec,
                const std::vector<torch::Tensor>& targets) {
  for (auto p : module.parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(7);
  c10::IValue outputs;
  if (interpreter == nullptr) {
    outputs = module.forward(inputs);
  } else {
    auto run = interpreter->Run(module, inputs);
    EXPECT_TRUE(run.ok()) << run.status();
    outputs = *run;
  }
  auto loss = ComputeLoss(loss_spec, outputs, targets);
  EXPECT_TRUE(loss.ok()) << loss.status();
  loss->backward();
  StepResult result;
  result.loss = loss->item<double>();
  for (auto p : module.parameters()) {
    result.grads.push_back(p.grad().defined() ? p.grad().clone()
                                              : torch::zeros_like(p));
  }
  return result;
}

TEST_P(InterpreterTest, SameLossAndGradientsAsTheModule) {
  const TestModel& model = GetParam();
  auto module = LoadModuleFile(ModelPath(model.name), torch::kCPU);
  ASSERT_TRUE(module.ok()) << module.status();
  auto graph = Graph::Create(*module);
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<v1::TensorSpec> specs;
  for (const auto& text : model.inputs) specs.push_back(*ParseTensorSpec(text));
  auto tensors = MakeInputs(specs, model.batch, torch::kCPU, 1);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::vector<c10::IValue> inputs(tensors->begin(), tensors->end());
  auto loss_spec = ParseLossSpec(model.loss);
  ASSERT_TRUE(loss_spec.ok());
  auto target = MakeTargets(*loss_spec, model.batch, torch::kCPU);
  ASSERT_TRUE(target.ok());

  torch::jit::setGraphExecutorOptimize(false);
  StepResult reference = Step(*module, nullptr, inputs, *loss_spec, *target);
  Interpreter interpreter(graph->get());
  StepResult interpreted =
      Step(*module, &interpreter, inputs, *loss_spec, *target);
  EXPECT_EQ(interpreted.loss, reference.loss);
  ASSERT_EQ(interpreted.grads.size(), reference.grads.size());
  ASSERT_FALSE(reference.grads.empty());
  double max_diff = 0;
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    max_diff = std::max(
        max_diff,
        (interpreted.grads[i] - reference.grads[i]).abs().max().item<double>());
  }
  EXPECT_EQ(max_diff, 0.0) << model.name;
}

INSTANTIATE_TEST_SUITE_P(Models, InterpreterTest,
                         ::testing::ValuesIn(testing::TestModels()),
                         [](const ::testing::TestParamInfo<TestModel>& info) {
                           return info.param.name;
                         });

TEST(InterpreterErrorTest, WrongInputsNameTheNode) {
  auto module = LoadModuleFile(ModelPath("mlp"), torch::kCPU);
  ASSERT_TRUE(module.ok());
  auto graph = Graph::Create(*module);
  ASSERT_TRUE(graph.ok());
  Interpreter interpreter(graph->get());
  auto wrong_count = interpreter.Run(*module, {});
  EXPECT_EQ(wrong_count.status().code(), absl::StatusCode::kInvalidArgument);
  auto wrong_shape = interpreter.Run(*module, {torch::randn({2, 31})});
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shape.status().message().find("aten::linear, fc1"),
            std::string::npos)
      << wrong_shape.status();
  EXPECT_GE(interpreter.failed_node(), 0);
}

TEST(InterpreterHooksTest, HooksSeeEveryNodeInOrder) {
  auto module = LoadModuleFile(ModelPath("two_inputs"), torch::kCPU);
  ASSERT_TRUE(module.ok());
  auto graph = Graph::Create(*module);
  ASSERT_TRUE(graph.ok());
  Interpreter interpreter(graph->get());
  std::vector<int> before, after;
  InterpreterHooks hooks;
  hooks.before_node = [&](int id) { before.push_back(id); };
  hooks.after_node = [&](int id, std::vector<c10::IValue>&) {
    after.push_back(id);
  };
  auto out = interpreter.Run(
      *module, {torch::randn({3, 8}), torch::randn({3, 4})}, hooks);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->isTuple());
  EXPECT_EQ(out->toTuple()->elements().size(), 2u);
  ASSERT_EQ(static_cast<int>(before.size()), (*graph)->num_nodes());
  for (int i = 0; i < (*graph)->num_nodes(); ++i) {
    EXPECT_EQ(before[i], i);
    EXPECT_EQ(after[i], i);
  }
}

}  // namespace
TEST(OutOfMemoryMessageTest, ACudaLibraryThatCannotAllocateIsOutOfMemory) {
  // A full card, as one model beside others saw it on an H200.
  EXPECT_TRUE(IsOutOfMemoryMessage(
      "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
      "`cublasCreate(handle)`"));
  EXPECT_TRUE(IsOutOfMemoryMessage("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"));
  EXPECT_TRUE(
      IsOutOfMemoryMessage("CUDA out of memory. Tried to allocate 24.00 GiB."));
  EXPECT_FALSE(IsOutOfMemoryMessage(
      "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`"));
  EXPECT_FALSE(
      IsOutOfMemoryMessage("Expected all tensors to be on the same device"));
}

}  // namespace mutwo::worker
