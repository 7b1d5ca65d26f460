#include "worker/inputs.h"

#include <gtest/gtest.h>

#include "common/parse.h"
#include "worker/chunked_cross_entropy.h"
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
  // The only one-element output is the loss the model returns.
  EXPECT_FLOAT_EQ(ComputeLoss(spec, outputs, {})->item<float>(), 10.0f);
  EXPECT_EQ(ComputeLoss(spec, c10::IValue(a), {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // not a scalar
  EXPECT_FLOAT_EQ(ComputeLoss(spec, c10::IValue(b), {})->item<float>(), 10.0f);

  auto ce = ParseLossSpec("cross_entropy:y:int64[B]{0,4}");
  ASSERT_TRUE(ce.ok());
  torch::Tensor logits = torch::zeros({2, 4});
  auto target = MakeTargets(*ce, 2, torch::kCPU);
  ASSERT_TRUE(target.ok());
  ASSERT_EQ(target->size(), 1u);
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
  auto target = MakeTargets(*ce, 2, torch::kCPU);
  ASSERT_TRUE(target.ok());
  ASSERT_EQ(target->size(), 1u);
  torch::Tensor logits = torch::zeros({2, 4});
  torch::Tensor aux = torch::ones({2, 4});
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("logits", logits);
  dict.insert("aux", aux);
  auto guess = ComputeLoss(*ce, c10::IValue(dict), *target);
  ASSERT_EQ(guess.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(guess.status().message().find(
                "2 entries (logits [2,4], aux [2,4]); name the output the loss "
                "reads with cross_entropy@OUTPUT, like cross_entropy@logits:"),
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

// chunked_cross_entropy: the loss and the logits' gradient of torch's
// cross_entropy (to rounding), whatever the chunking (here 3 rows a chunk:
// 7 chunks, the last one short); classes only in the last dimension; a
// target range past the classes is refused before anything runs.
TEST(ComputeLossTest, ChunkedCrossEntropyIsCrossEntropy) {
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({4, 5, 11}) * 3;
  const torch::Tensor target = torch::randint(0, 11, {4, 5});
  torch::Tensor a = logits.clone().requires_grad_();
  torch::Tensor b = logits.clone().requires_grad_();
  torch::Tensor expected = torch::nn::functional::cross_entropy(
      a.reshape({-1, 11}), target.reshape({-1}));
  torch::Tensor chunked = ChunkedCrossEntropy(
      b.reshape({-1, 11}), target.reshape({-1}), LogitsReuse::kNever,
      /*chunk_bytes=*/3 * 11 * 4);
  EXPECT_NEAR(chunked.item<float>(), expected.item<float>(), 1e-6);
  (expected * 1.7).backward();
  (chunked * 1.7).backward();
  EXPECT_LE((a.grad() - b.grad()).abs().max().item<float>(), 1e-7);

  // Through ComputeLoss, from the spec.
  auto spec = ParseLossSpec("chunked_cross_entropy:y:int64[B,5]{0,11}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto targets = MakeTargets(*spec, 4, torch::kCPU);
  ASSERT_TRUE(targets.ok());
  auto plain = ParseLossSpec("cross_entropy:y:int64[B,5]{0,11}");
  auto loss = ComputeLoss(*spec, c10::IValue(logits), *targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(loss->item<float>(),
              ComputeLoss(*plain, c10::IValue(logits), *targets)->item<float>(),
              1e-6);

  // Classes in dimension 1 ([B,C,H,W] with [B,H,W]): refused, naming both
  // shapes and the loss that takes them.
  auto seg = ParseLossSpec("chunked_cross_entropy:y:int64[B,3,3]{0,4}");
  ASSERT_TRUE(seg.ok());
  auto seg_targets = MakeTargets(*seg, 2, torch::kCPU);
  ASSERT_TRUE(seg_targets.ok());
  auto refused =
      ComputeLoss(*seg, c10::IValue(torch::zeros({2, 4, 3, 3})), *seg_targets);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "output shape [2,4,3,3] does not fit target shape [2,3,3]"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("use cross_entropy"),
            std::string::npos);

  // Classes drawn past the output's last dimension.
  auto wide = ParseLossSpec("chunked_cross_entropy:y:int64[B,5]{0,12}");
  ASSERT_TRUE(wide.ok());
  auto wide_targets = MakeTargets(*wide, 4, torch::kCPU);
  ASSERT_TRUE(wide_targets.ok());
  auto past = ComputeLoss(*wide, c10::IValue(logits), *wide_targets);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find(
                "target \"y:int64[B,5]{0,12}\" draws classes outside [0,11)"),
            std::string::npos)
      << past.status();
}

// The logits' gradient written over the logits (LogitsReuse): where the
// caller is done with them (kCallerDone) and where nothing but the loss holds
// them (kSoleHolder, the worker), the gradient is torch's and it lands in the
// logits' memory; where a handle the rule forbids is alive (the caller's under
// kSoleHolder, tanh's saved output, a leaf) the logits stay intact and the
// gradient is still torch's.
TEST(ComputeLossTest, ChunkedCrossEntropyReusesTheLogitsOnlyWhereNothingHolds) {
  torch::manual_seed(5);
  const torch::Tensor h0 = torch::randn({4, 5, 11});
  const torch::Tensor target = torch::randint(0, 11, {4, 5});
  const auto reference = [&](bool tanh) {
    torch::Tensor h = h0.clone().requires_grad_();
    torch::Tensor logits = tanh ? h.tanh() : h * 2;
    torch::nn::functional::cross_entropy(logits.reshape({-1, 11}),
                                         target.reshape({-1}))
        .backward();
    return h.grad();
  };
  struct Case {
    std::string name;
    LogitsReuse reuse;
    bool tanh;          // logits = tanh(h) (saves its output), else h * 2
    bool caller_holds;  // the test keeps a handle on the logits
    bool reused;        // expected
  };
  for (const Case& c : std::vector<Case>{
           {"caller done", LogitsReuse::kCallerDone, false, true, true},
           {"sole holder", LogitsReuse::kSoleHolder, false, false, true},
           {"sole holder, caller holds", LogitsReuse::kSoleHolder, false, true,
            false},
           {"tanh saved its output", LogitsReuse::kCallerDone, true, true,
            false},
           {"never", LogitsReuse::kNever, false, true, false}}) {
    torch::Tensor h = h0.clone().requires_grad_();
    torch::Tensor logits = c.tanh ? h.tanh() : h * 2;
    const torch::Tensor before = logits.detach().clone();
    void* grad_data = nullptr;
    logits.register_hook([&](const torch::Tensor& g) {
      grad_data = g.data_ptr();
      return torch::Tensor();
    });
    void* logits_data = logits.data_ptr();
    torch::Tensor loss = ChunkedCrossEntropy(logits, target, c.reuse,
                                             /*chunk_bytes=*/3 * 11 * 4);
    if (!c.caller_holds) logits = torch::Tensor();
    loss.backward();
    EXPECT_LE((h.grad() - reference(c.tanh)).abs().max().item<float>(), 1e-6)
        << c.name;
    EXPECT_EQ(grad_data == logits_data, c.reused) << c.name;
    if (c.caller_holds && !c.reused) {
      EXPECT_TRUE(torch::equal(logits.detach(), before)) << c.name;
    }
  }
  // A leaf's memory is its own: never written over.
  torch::Tensor leaf = h0.clone().requires_grad_();
  ChunkedCrossEntropy(leaf, target, LogitsReuse::kCallerDone).backward();
  EXPECT_TRUE(torch::equal(leaf.detach(), h0));
}

// mse: the mean squared error against a generated float target of the
// output's shape, as torch computes it; another shape is refused, naming
// both.
TEST(ComputeLossTest, MseAgainstAGeneratedTarget) {
  auto mse = ParseLossSpec("mse:z:float32[B,3]");
  ASSERT_TRUE(mse.ok()) << mse.status();
  torch::manual_seed(5);
  auto targets = MakeTargets(*mse, 2, torch::kCPU);
  ASSERT_TRUE(targets.ok()) << targets.status();
  ASSERT_EQ(targets->size(), 1u);
  EXPECT_EQ((*targets)[0].sizes(), torch::IntArrayRef({2, 3}));
  EXPECT_EQ((*targets)[0].scalar_type(), torch::kFloat32);
  torch::manual_seed(5);
  EXPECT_TRUE(
      torch::equal((*targets)[0], (*MakeTargets(*mse, 2, torch::kCPU))[0]));
  const torch::Tensor out = torch::arange(6, torch::kFloat32).reshape({2, 3});
  auto loss = ComputeLoss(*mse, c10::IValue(out), *targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const float expected = (out - (*targets)[0]).pow(2).mean().item<float>();
  EXPECT_GT(expected, 0.0f);
  EXPECT_FLOAT_EQ(loss->item<float>(), expected);
  auto bad = ComputeLoss(*mse, c10::IValue(torch::zeros({2, 4})), *targets);
  EXPECT_EQ(bad.status().message(),
            "loss mse: output shape [2,4] differs from target "
            "\"z:float32[B,3]\" shape [2,3]; give the target the output's "
            "shape");
}

// model and mse, like cross_entropy, read one output: a dict or tuple with
// several candidates is refused, naming them and the @OUTPUT syntax.
TEST(ComputeLossTest, OneOutputKindsRefuseSeveralCandidates) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("pred", torch::zeros({2, 3}));
  dict.insert("aux", torch::ones({2, 3}));
  auto mse = ParseLossSpec("mse:z:float32[B,3]");
  auto targets = MakeTargets(*mse, 2, torch::kCPU);
  ASSERT_TRUE(targets.ok()) << targets.status();
  auto guess = ComputeLoss(*mse, c10::IValue(dict), *targets);
  EXPECT_EQ(guess.status().message(),
            "loss mse: the model returns a dict with floating-point tensors in "
            "2 entries (pred [2,3], aux [2,3]); name the output the loss reads "
            "with mse@OUTPUT, like mse@pred:z:float32[B,3] (terms over "
            "several outputs are joined by +)");
  auto named = ComputeLoss(*ParseLossSpec("mse@aux:z:float32[B,3]"),
                           c10::IValue(dict), *targets);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_FLOAT_EQ(
      named->item<float>(),
      (torch::ones({2, 3}) - (*targets)[0]).pow(2).mean().item<float>());

  v1::LossSpec model;
  model.set_kind(v1::LossSpec::MODEL);
  auto two = c10::ivalue::Tuple::create(
      {torch::full({}, 1.0f), torch::zeros({2, 3}), torch::full({1}, 2.0f)});
  auto ambiguous = ComputeLoss(model, c10::IValue(two), {});
  EXPECT_EQ(ambiguous.status().message(),
            "loss model: the model returns a tuple with one-element "
            "floating-point tensors in 2 entries (0 [], 2 [1]); name the "
            "output the loss reads with model@OUTPUT, like model@0 (terms "
            "over several outputs are joined by +)");
  model.set_output("2");
  EXPECT_FLOAT_EQ(ComputeLoss(model, c10::IValue(two), {})->item<float>(),
                  2.0f);
}

// Terms over several outputs: the loss is their sum, so the gradient of a
// two-head model's shared trunk is the sum of each term's gradient (each
// term's backward run on its own, as a LibTorch reference); each term gets
// its own target, in order.
TEST(ComputeLossTest, TermsAreSummedWithATargetEach) {
  auto loss = ParseLossSpec(
      "cross_entropy@logits:y:int64[B]{0,4}+mse@aux:z:float32[B,3]+sum@aux");
  ASSERT_TRUE(loss.ok()) << loss.status();
  torch::manual_seed(3);
  auto targets = MakeTargets(*loss, 2, torch::kCPU);
  ASSERT_TRUE(targets.ok()) << targets.status();
  ASSERT_EQ(targets->size(), 2u);
  EXPECT_EQ((*targets)[0].scalar_type(), torch::kInt64);
  EXPECT_EQ((*targets)[1].sizes(), torch::IntArrayRef({2, 3}));
  torch::nn::Linear trunk(5, 6), logits_head(6, 4), aux_head(6, 3);
  const torch::Tensor x = torch::randn({2, 5});
  auto forward = [&]() {
    const torch::Tensor h = torch::relu(trunk(x));
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    dict.insert("logits", logits_head(h));
    dict.insert("aux", aux_head(h));
    return dict;
  };
  auto zero = [&]() {
    for (auto& p : trunk->parameters()) p.mutable_grad() = torch::Tensor();
  };
  auto total = ComputeLoss(*loss, c10::IValue(forward()), *targets);
  ASSERT_TRUE(total.ok()) << total.status();
  total->backward();
  const torch::Tensor grad = trunk->weight.grad().clone();
  torch::Tensor reference_grad = torch::zeros_like(grad);
  float reference_loss = 0;
  for (int term = 0; term < 3; ++term) {
    zero();
    auto out = forward();
    const torch::Tensor logits = out.at("logits").toTensor();
    const torch::Tensor aux = out.at("aux").toTensor();
    torch::Tensor value =
        term == 0 ? torch::nn::functional::cross_entropy(logits, (*targets)[0])
        : term == 1 ? torch::nn::functional::mse_loss(aux, (*targets)[1])
                    : aux.sum();
    value.backward();
    reference_loss += value.item<float>();
    reference_grad += trunk->weight.grad();
    EXPECT_GT(trunk->weight.grad().abs().sum().item<float>(), 0.0f) << term;
  }
  EXPECT_NEAR(total->item<float>(), reference_loss, 1e-4);
  EXPECT_TRUE(torch::allclose(grad, reference_grad, 1e-5, 1e-6))
      << (grad - reference_grad).abs().max();
  const c10::IValue dict = forward();
  // A term that does not fit says which term it is.
  auto bad = ComputeLoss(*ParseLossSpec("mean@logits+mse@nope:z:float32[B,3]"),
                         dict, {(*targets)[1]});
  EXPECT_NE(bad.status().message().find(
                "term mse@nope:z:float32[B,3]: loss @nope: the model's output "
                "dict has no key \"nope\""),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace mutwo::worker
