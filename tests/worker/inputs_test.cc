#include "worker/inputs.h"

#include <gtest/gtest.h>

#include "common/parse.h"
#include "worker/foreach_optimizer.h"

namespace mutwo::worker {
namespace {

v1::TensorSpec Spec(const std::string& text) {
  auto spec = ParseTensorSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(MakeInputsTest, SubstitutesBatchAndRespectsDtypesAndRanges) {
  auto inputs =
      MakeInputs({Spec("x:float32[B,3,8]"), Spec("t:int64[B,5]{3,9}")}, 6,
                 torch::kCPU, 11);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->size(), 2u);
  EXPECT_EQ((*inputs)[0].sizes(), (std::vector<int64_t>{6, 3, 8}));
  EXPECT_EQ((*inputs)[0].scalar_type(), torch::kFloat32);
  EXPECT_EQ((*inputs)[1].scalar_type(), torch::kInt64);
  EXPECT_GE((*inputs)[1].min().item<int64_t>(), 3);
  EXPECT_LT((*inputs)[1].max().item<int64_t>(), 9);
  auto again = MakeInputs({Spec("x:float32[B,3,8]"), Spec("t:int64[B,5]{3,9}")},
                          6, torch::kCPU, 11);
  EXPECT_TRUE(torch::equal((*inputs)[0], (*again)[0]));  // seeded
  EXPECT_FALSE(MakeInputs({Spec("x:float32[B]")}, 0, torch::kCPU, 0).ok());
}

TEST(ComputeLossTest, KindsComputeWhatTheyPromise) {
  torch::Tensor a = torch::tensor({1.0f, 2.0f, 3.0f});
  torch::Tensor b = torch::tensor({10.0f});
  c10::IValue outputs = c10::ivalue::Tuple::create({a, b});
  v1::LossSpec spec;
  spec.set_kind(v1::LossSpec::MEAN);
  EXPECT_FLOAT_EQ(ComputeLoss(spec, outputs, {})->item<float>(), 12.0f);
  spec.set_kind(v1::LossSpec::KIND_UNSPECIFIED);
  EXPECT_FLOAT_EQ(ComputeLoss(spec, outputs, {})->item<float>(), 12.0f);
  spec.set_kind(v1::LossSpec::SUM);
  EXPECT_FLOAT_EQ(ComputeLoss(spec, outputs, {})->item<float>(), 16.0f);
  spec.set_kind(v1::LossSpec::MODEL);
  EXPECT_EQ(ComputeLoss(spec, outputs, {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // first output not scalar
  EXPECT_FLOAT_EQ(ComputeLoss(spec, c10::IValue(b), {})->item<float>(), 10.0f);

  auto ce = ParseLossSpec("cross_entropy:y:int64[B]{0,4}");
  ASSERT_TRUE(ce.ok());
  torch::Tensor logits = torch::zeros({2, 4});
  auto target = MakeTarget(*ce, 2, torch::kCPU);
  ASSERT_TRUE(target.ok());
  EXPECT_NEAR(ComputeLoss(*ce, c10::IValue(logits), *target)->item<float>(),
              std::log(4.0), 1e-5);
  auto bad = ComputeLoss(*ce, c10::IValue(torch::zeros({3, 4})), *target);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("does not fit target"),
            std::string::npos);
  EXPECT_FALSE(
      ComputeLoss(spec, c10::IValue(torch::ones({2}, torch::kInt64)), {}).ok());
}

// cross_entropy over a dict or tuple with floating-point tensors in several
// entries is refused, naming them, unless @KEY says which are the logits.
TEST(ComputeLossTest, CrossEntropyNamesTheLogitsOfADictOrTuple) {
  auto ce = ParseLossSpec("cross_entropy:y:int64[B]{0,4}");
  ASSERT_TRUE(ce.ok());
  auto target = MakeTarget(*ce, 2, torch::kCPU);
  ASSERT_TRUE(target.ok());
  torch::Tensor logits = torch::zeros({2, 4});
  torch::Tensor aux = torch::ones({2, 4});
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("logits", logits);
  dict.insert("aux", aux);
  auto guess = ComputeLoss(*ce, c10::IValue(dict), *target);
  ASSERT_EQ(guess.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(guess.status().message().find(
                "2 entries (logits [2,4], aux [2,4]); name the logits with "
                "cross_entropy@KEY, like cross_entropy@logits:"),
            std::string::npos)
      << guess.status();
  auto tuple = ComputeLoss(
      *ce, c10::IValue(c10::ivalue::Tuple::create({logits, aux})), *target);
  EXPECT_NE(tuple.status().message().find("(0 [2,4], 1 [2,4])"),
            std::string::npos)
      << tuple.status();
  // Named: that entry's cross entropy.
  auto named = ParseLossSpec("cross_entropy@aux:y:int64[B]{0,4}");
  ASSERT_TRUE(named.ok());
  auto loss = ComputeLoss(*named, c10::IValue(dict), *target);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(loss->item<float>(), std::log(4.0), 1e-5);
  // One floating-point entry (beside integers): nothing to choose.
  c10::impl::GenericDict one(c10::StringType::get(), c10::TensorType::get());
  one.insert("logits", logits);
  one.insert("ids", torch::ones({2}, torch::kInt64));
  EXPECT_TRUE(ComputeLoss(*ce, c10::IValue(one), *target).ok());
}

TEST(OptimizerTest, StatesPerParameterMatchTorchOptim) {
  EXPECT_EQ(OptimizerStatesPerParameter(v1::OptimizerSpec::ADAM), 2);
  EXPECT_EQ(OptimizerStatesPerParameter(v1::OptimizerSpec::ADAMW), 2);
  EXPECT_EQ(OptimizerStatesPerParameter(v1::OptimizerSpec::SGD_MOMENTUM), 1);
  EXPECT_EQ(OptimizerStatesPerParameter(v1::OptimizerSpec::SGD), 0);
  EXPECT_EQ(OptimizerStatesPerParameter(v1::OptimizerSpec::NONE), 0);
  for (const char* text : {"adam", "adamw", "sgd_momentum", "sgd"}) {
    auto spec = ParseOptimizerSpec(text);
    ASSERT_TRUE(spec.ok());
    torch::Tensor w = torch::randn({4, 5}, torch::requires_grad());
    auto optimizer = MakeOptimizer(*spec, {w});
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    w.sum().backward();
    (*optimizer)->step();
    // The optimizer's state holds as many tensors as the planner accounts.
    auto* foreach_opt = dynamic_cast<ForeachOptimizer*>(optimizer->get());
    ASSERT_NE(foreach_opt, nullptr) << text;
    const int64_t tensors = foreach_opt->state_tensors();
    EXPECT_EQ(tensors, OptimizerStatesPerParameter(spec->kind())) << text;
  }
  auto none = MakeOptimizer(*ParseOptimizerSpec("none"), {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->get(), nullptr);
}

TEST(StorageBytesTest, CountsSharedStoragesOnce) {
  torch::Tensor a = torch::zeros({10}, torch::kFloat32);
  torch::Tensor view = a.slice(0, 2, 5);
  torch::Tensor b = torch::zeros({3}, torch::kFloat64);
  EXPECT_EQ(StorageBytes({a, view, b}), 40 + 24);
}

}  // namespace
}  // namespace mutwo::worker
