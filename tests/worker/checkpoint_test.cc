// One segment's run (worker/checkpoint.h, SegmentRun) on small graphs
// written as IR text: one case per pitfall its comments name. Each step
// runs the graph node by node, the segment through its autograd function,
// and checks what the user relies on: the replay rebuilds exactly the
// values the forward freed, gradients and module buffers equal to the
// plain step, and storages that are not the segment's are never freed.
#include "worker/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mutwo/v1/types.pb.h"
#include "tests/worker/ir_graph.h"
#include "worker/execution_plan.h"
#include "worker/interpreter.h"

namespace mutwo::testing {
namespace {

using worker::CompileSchedule;
using worker::ExecutionPlan;
using worker::Interpreter;
using worker::InterpreterEnv;
using worker::SegmentRun;

// The sum of the tensors forward returned (a tensor or a tuple of them).
torch::Tensor SumOf(const c10::IValue& out) {
  torch::Tensor loss = torch::zeros({});
  if (!out.isTuple()) return loss + out.toTensor().sum();
  for (const c10::IValue& v : out.toTupleRef().elements()) {
    loss = loss + v.toTensor().sum();
  }
  return loss;
}

// Runs the graph of `g` node by node on `module` with its one compiled
// segment run by a SegmentRun: the interpreter runs the nodes outside the
// range, FreeAfter follows each of them.
class SegmentStep {
 public:
  SegmentStep(const IrGraph& g, const v1::Schedule& schedule,
              const torch::jit::Module& module)
      : g_(g), module_(module), interpreter_(g.graph.get()) {
    auto plan = CompileSchedule(*g.graph, schedule);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (plan.ok()) plan_ = *std::move(plan);
    EXPECT_EQ(plan_.segments.size(), 1u);
    run_ = std::make_unique<SegmentRun>(&plan_.segments[0], g.graph.get(),
                                        &interpreter_, &module_,
                                        torch::Device(torch::kCPU));
  }

  // Binds `self` and the graph inputs after it.
  void Start(const std::vector<c10::IValue>& inputs) {
    const auto& graph_inputs = g_.graph->graph()->inputs();
    env_[graph_inputs[0]] = module_._ivalue();
    for (size_t i = 0; i < inputs.size(); ++i) {
      env_[graph_inputs[i + 1]] = inputs[i];
    }
    next_ = 0;
  }
  // Runs nodes up to `last` (the segment as a whole when reached).
  void RunTo(int last) {
    const worker::SegmentPlan& s = plan_.segments[0];
    while (next_ <= last) {
      if (next_ == s.first_node) {
        run_->Forward(env_);
        next_ = s.last_node;
      } else {
        interpreter_.RunRange(next_, next_, env_);
      }
      if (next_ >= s.first_node) run_->FreeAfter(next_);
      ++next_;
    }
  }
  // Runs the rest of forward and returns the sum of what it returns.
  torch::Tensor Finish() {
    RunTo(g_.graph->num_nodes() - 1);
    return SumOf(env_.at(g_.graph->graph()->outputs()[0]));
  }
  torch::Tensor Value(const std::string& name) const {
    return env_.at(g_.value(name)).toTensor();
  }
  // Keeps a copy of what `%name` holds now (call while it is resident).
  void Keep(const std::string& name) {
    kept_.push_back({Value(name), Value(name).detach().clone()});
  }
  // Replays the segment: every kept value is resident again, as it was.
  void ReplayAndExpectKeptRebuilt() {
    try {
      run_->Replay();
    } catch (const std::exception& e) {
      FAIL() << "the replay failed: " << e.what();
    }
    for (const auto& [tensor, before] : kept_) {
      ASSERT_NE(tensor.storage().data(), nullptr) << "not given back";
      EXPECT_TRUE(torch::equal(tensor.detach(), before));
    }
  }

  SegmentRun& run() { return *run_; }
  const worker::SegmentPlan& segment() const { return plan_.segments[0]; }
  InterpreterEnv& env() { return env_; }

 private:
  const IrGraph& g_;
  torch::jit::Module module_;
  Interpreter interpreter_;
  ExecutionPlan plan_;
  std::unique_ptr<SegmentRun> run_;
  InterpreterEnv env_;
  int next_ = 0;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> kept_;  // (now, copy)
};

// The plain step's loss over `module` (the interpreter, no schedule).
torch::Tensor PlainLoss(const IrGraph& g, const torch::jit::Module& module,
                        const std::vector<c10::IValue>& inputs) {
  Interpreter interpreter(g.graph.get());
  auto out = interpreter.Run(module, inputs);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? SumOf(*out) : torch::zeros({});
}

// The gradient of `loss` with respect to `x` is the plain step's.
void ExpectGradient(const torch::Tensor& loss, const torch::Tensor& x,
                    const torch::Tensor& plain_grad) {
  const torch::Tensor grad = torch::autograd::grad({loss}, {x})[0];
  EXPECT_TRUE(torch::allclose(grad, plain_grad)) << grad << plain_grad;
}

torch::Tensor Input(int64_t rows = 3, int64_t cols = 3) {
  torch::manual_seed(1);
  return torch::randn({rows, cols}).requires_grad_(true);
}

// The output storage is freed after its last forward read (not at the end
// of the range), the replay gives it back with the same values, and the
// gradients are the plain step's.
TEST(CheckpointTest, FreedOutputIsRebuiltByTheReplay) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  %c : Tensor = aten::sigmoid(%b)
  %d : Tensor = aten::mul(%c, %c)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"b", "c"});
  torch::Tensor x = Input();
  const torch::Tensor plain_grad =
      torch::autograd::grad({PlainLoss(g, g.module, {x})}, {x})[0];

  SegmentStep step(g, schedule, g.module);
  step.Start({x});
  step.RunTo(g.id("c"));
  ASSERT_EQ(step.run().freed_bytes(), 0) << "freed before its reader ran";
  const torch::Tensor c = step.Value("c");
  step.Keep("c");
  step.RunTo(g.id("d"));
  EXPECT_EQ(step.run().freed_bytes(), c.storage().nbytes());
  EXPECT_EQ(c.storage().data(), nullptr);
  torch::Tensor loss = step.Finish();
  step.ReplayAndExpectKeptRebuilt();
  EXPECT_EQ(step.run().freed_bytes(), 0);
  ExpectGradient(loss, x, plain_grad);
}

// The replay runs with the RNG state of the forward run: dropout draws the
// same mask, whatever ran in between.
TEST(CheckpointTest, DropoutReplaysTheSameMask) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %p : float = prim::Constant[value=0.5]()
  %train : bool = prim::Constant[value=1]()
  %a : Tensor = aten::sigmoid(%x)
  %c : Tensor = aten::dropout(%a, %p, %train)
  %d : Tensor = aten::mul(%c, %c)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"c"});
  SegmentStep step(g, schedule, g.module);
  step.Start({Input(16, 16)});
  step.RunTo(g.id("c"));
  step.Keep("c");
  step.Finish();
  ASSERT_GT(step.run().freed_bytes(), 0);
  torch::rand({64});  // other draws between forward and backward
  step.ReplayAndExpectKeptRebuilt();
}

// A module with batch norm's parameters and running statistics.
torch::jit::Module BatchNormModule() {
  torch::jit::Module m(c10::QualifiedName("BatchNormModule"));
  torch::manual_seed(2);
  m.register_parameter("weight", torch::rand({3}).requires_grad_(),
                       /*is_buffer=*/false);
  m.register_parameter("bias", torch::rand({3}).requires_grad_(),
                       /*is_buffer=*/false);
  m.register_buffer("running_mean", torch::zeros({3}));
  m.register_buffer("running_var", torch::ones({3}));
  return m;
}

constexpr char kBatchNorm[] = R"IR(
graph(%self : Tensor, %x : Tensor):
  %train : bool = prim::Constant[value=1]()
  %momentum : float = prim::Constant[value=0.1]()
  %eps : float = prim::Constant[value=1e-05]()
  %a : Tensor = aten::sigmoid(%x)
  %w : Tensor = prim::GetAttr[name="weight"](%self)
  %b : Tensor = prim::GetAttr[name="bias"](%self)
  %rm : Tensor = prim::GetAttr[name="running_mean"](%self)
  %rv : Tensor = prim::GetAttr[name="running_var"](%self)
  %c : Tensor = aten::batch_norm(%a, %w, %b, %rm, %rv, %train, %momentum, %eps, %train)
  %d : Tensor = aten::mul(%c, %c)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR";

// The replay updates copies of the buffers: the running statistics move
// once per step, as in the plain step, and the parameters read inside the
// range get the plain step's gradients.
TEST(CheckpointTest, BatchNormStatisticsMoveOncePerStep) {
  IrGraph g(kBatchNorm, BatchNormModule());
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"w", "b", "rm", "rv", "c"});
  torch::Tensor x = Input(4, 3);
  torch::jit::Module plain = BatchNormModule();
  const torch::Tensor plain_w = plain.attr("weight").toTensor();
  const torch::Tensor plain_grad =
      torch::autograd::grad({PlainLoss(g, plain, {x})}, {plain_w})[0];
  const torch::Tensor plain_mean = plain.attr("running_mean").toTensor();

  torch::jit::Module module = BatchNormModule();
  SegmentStep step(g, schedule, module);
  EXPECT_EQ(step.segment().attribute_paths.size(), 4u);
  step.Start({x});
  torch::Tensor loss = step.Finish();
  ASSERT_GT(step.run().freed_bytes(), 0);
  step.run().Replay();
  const torch::Tensor w = module.attr("weight").toTensor();
  const torch::Tensor grad = torch::autograd::grad({loss}, {w})[0];
  EXPECT_TRUE(
      torch::allclose(module.attr("running_mean").toTensor(), plain_mean))
      << module.attr("running_mean").toTensor() << plain_mean;
  EXPECT_TRUE(torch::allclose(grad, plain_grad)) << grad << plain_grad;
}

// A list the graph appends to after the range replays with what it held
// when the range read it (the input is a snapshot of the list).
TEST(CheckpointTest, ListAppendedAfterTheRangeReplaysWhatItHeld) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %dim : int = prim::Constant[value=0]()
  %a : Tensor = aten::sigmoid(%x)
  %l : Tensor[] = prim::ListConstruct(%a)
  %c : Tensor = aten::cat(%l, %dim)
  %b : Tensor = aten::sigmoid(%x)
  %n : Tensor[] = aten::append(%l, %b)
  %f : Tensor = aten::mul(%c, %c)
  %e : Tensor = aten::cat(%l, %dim)
  %out : (Tensor, Tensor) = prim::TupleConstruct(%f, %e)
  return (%out)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"c"});
  torch::Tensor x = Input();
  const torch::Tensor plain_grad =
      torch::autograd::grad({PlainLoss(g, g.module, {x})}, {x})[0];
  SegmentStep step(g, schedule, g.module);
  step.Start({x});
  step.RunTo(g.id("c"));
  step.Keep("c");
  torch::Tensor loss = step.Finish();
  ASSERT_GT(step.run().freed_bytes(), 0);
  step.ReplayAndExpectKeptRebuilt();
  ExpectGradient(loss, x, plain_grad);
}

// An input the graph writes in place after the range is kept as a copy:
// the replay reads the value the forward read.
TEST(CheckpointTest, InputWrittenInPlaceLaterIsKeptAsACopy) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %one : int = prim::Constant[value=1]()
  %i : Tensor = aten::mul(%x, %x)
  %a : Tensor = aten::sigmoid(%i)
  %b : Tensor = aten::sigmoid(%x)
  %w : Tensor = aten::add_(%i, %b, %one)
  %e : Tensor = aten::mul(%a, %w)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRetain(g, &schedule, "b");
  torch::Tensor x = Input();
  const torch::Tensor plain_grad =
      torch::autograd::grad({PlainLoss(g, g.module, {x})}, {x})[0];
  SegmentStep step(g, schedule, g.module);
  ASSERT_EQ(step.segment().copy_input.size(), 1u);
  step.Start({x});
  step.RunTo(g.id("a"));
  step.Keep("a");
  torch::Tensor loss = step.Finish();
  ASSERT_GT(step.run().freed_bytes(), 0);
  step.ReplayAndExpectKeptRebuilt();
  ExpectGradient(loss, x, plain_grad);
}

// A member's output that is a view of an input (an op returned a view)
// shares the input's storage: the segment never frees it.
TEST(CheckpointTest, OutputSharingAnInputsStorageIsNeverFreed) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %i : Tensor = aten::sigmoid(%x)
  %v : Tensor = aten::t(%i)
  %q : Tensor = aten::sigmoid(%v)
  %e : Tensor = aten::mul(%q, %i)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "v", {"v"});
  SegmentStep step(g, schedule, g.module);
  ASSERT_THAT(step.segment().freeable, ::testing::ElementsAre(true));
  step.Start({Input()});
  step.RunTo(g.id("v"));
  const torch::Tensor i = step.Value("i");
  step.Finish();
  EXPECT_EQ(step.run().freed_bytes(), 0);
  EXPECT_NE(i.storage().data(), nullptr);
}

// A storage a later segment pins (its input) stays until that segment
// replayed, then goes; its readers still need this segment's replay.
TEST(CheckpointTest, PinnedOutputIsFreedWhenThePinningSegmentReplays) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %c : Tensor = aten::sigmoid(%a)
  %d : Tensor = aten::mul(%c, %c)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"c"});
  SegmentStep step(g, schedule, g.module);
  // Any other run stands for the later segment (only its identity counts).
  SegmentStep other(g, schedule, g.module);
  step.Start({Input()});
  step.RunTo(g.id("c"));
  const torch::Tensor c = step.Value("c");
  step.run().Pin({c}, &other.run());
  step.Finish();
  EXPECT_EQ(step.run().freed_bytes(), 0) << "a pinned storage was freed";
  step.run().Unpin(&other.run());
  EXPECT_EQ(step.run().freed_bytes(), c.storage().nbytes());
  const std::set<int> readers =
      step.run().readers([](int, const c10::StorageImpl*) { return true; });
  EXPECT_THAT(readers, ::testing::ElementsAre(g.id("d")));
}

// A buffer the range reads itself and returns (`mask = self.mask` inside
// the range) goes out as an alias: the buffer gets no autograd history,
// which would outlive the step.
TEST(CheckpointTest, ABufferTheRangeReturnsGoesOutAsAnAlias) {
  torch::jit::Module module(c10::QualifiedName("MaskModule"));
  module.register_buffer("mask", torch::ones({3, 3}));
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %m : Tensor = prim::GetAttr[name="mask"](%self)
  %c : Tensor = aten::mul(%a, %m)
  %d : Tensor = aten::mul(%c, %m)
  return (%d)
)IR",
            module);
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"m", "c"});
  SegmentStep step(g, schedule, module);
  step.Start({Input()});
  step.RunTo(g.id("c"));
  const torch::Tensor mask = module.attr("mask").toTensor();
  EXPECT_FALSE(step.Value("m").is_same(mask));
  EXPECT_EQ(mask.grad_fn(), nullptr);
  step.Finish();
}

// A segment output put in a tuple (a traced T5 layer norm's) stays until
// the node that unpacks and uses it ran, not only until the
// TupleConstruct; the replay gives it back, and the gradients are the
// plain step's.
TEST(CheckpointTest, OutputInATupleIsFreedAfterItsUnpackedUse) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor, %w : Tensor):
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::sigmoid(%x)
  %n : Tensor = aten::sigmoid(%h)
  %t : (Tensor, Tensor) = prim::TupleConstruct(%h, %n)
  %hu : Tensor, %nu : Tensor = prim::TupleUnpack(%t)
  %l : Tensor = aten::mm(%nu, %w)
  %o : Tensor = aten::add(%l, %hu, %one)
  return (%o)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "n", {"n"});
  torch::Tensor x = Input();
  const torch::Tensor w = torch::randn({3, 3});
  const torch::Tensor plain_grad =
      torch::autograd::grad({PlainLoss(g, g.module, {x, w})}, {x})[0];

  SegmentStep step(g, schedule, g.module);
  step.Start({x, w});
  step.RunTo(g.id("n"));
  const torch::Tensor n = step.Value("n");
  step.Keep("n");
  step.RunTo(g.id("nu"));
  ASSERT_EQ(step.run().freed_bytes(), 0) << "freed before the mm read it";
  step.RunTo(g.id("l"));
  EXPECT_EQ(step.run().freed_bytes(), n.storage().nbytes());
  torch::Tensor loss = step.Finish();
  step.ReplayAndExpectKeptRebuilt();
  ExpectGradient(loss, x, plain_grad);
}

// A segment output forward returns inside a tuple is read by the loss:
// never freed, and the loss is the plain step's.
TEST(CheckpointTest, OutputReturnedInATupleIsNeverFreed) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  %c : Tensor = aten::sigmoid(%b)
  %t : (Tensor, Tensor) = prim::TupleConstruct(%c, %b)
  return (%t)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "b", {"b"});
  torch::Tensor x = Input();
  const torch::Tensor plain = PlainLoss(g, g.module, {x});
  SegmentStep step(g, schedule, g.module);
  step.Start({x});
  step.RunTo(g.id("t"));
  ASSERT_EQ(step.run().freed_bytes(), 0) << "freed what forward returns";
  const torch::Tensor loss = step.Finish();
  EXPECT_EQ(step.run().freed_bytes(), 0);
  EXPECT_TRUE(torch::allclose(loss, plain)) << loss << plain;
}

// A tensor constant of the graph that the range makes and later nodes read
// (a traced `v + 1e-6`, read by every layer norm) goes out as an alias:
// the constant itself gets no autograd history. With the segment's history
// on it, the replay (which runs the same constant node) linked its graph to
// the segment's own autograd node, and the segment's backward ran itself
// again and waited on its own lock forever (a T5-like model at its floor).
TEST(CheckpointTest, ATensorConstantTheRangeReturnsGoesOutAsAnAlias) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %one : int = prim::Constant[value=1]()
  %a : Tensor = aten::sigmoid(%x)
  %eps : Float(requires_grad=0, device=cpu) = prim::Constant[value={0.5}]()
  %b : Tensor = aten::add(%a, %eps, %one)
  %c : Tensor = aten::sigmoid(%b)
  %d : Tensor = aten::mul(%c, %eps)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR");
  const torch::Tensor eps = g.TensorConstant("eps");
  ASSERT_TRUE(eps.defined());
  eps.fill_(0.5);
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"a", "b", "c"});
  torch::Tensor x = Input();
  const torch::Tensor plain_grad =
      torch::autograd::grad({PlainLoss(g, g.module, {x})}, {x})[0];

  SegmentStep step(g, schedule, g.module);
  ASSERT_THAT(step.segment().outputs, ::testing::Contains(g.value("eps")));
  step.Start({x});
  step.RunTo(g.id("c"));
  ASSERT_EQ(eps.grad_fn(), nullptr) << "the graph's constant got a history";
  ASSERT_FALSE(eps.requires_grad());
  torch::Tensor loss = step.Finish();
  step.ReplayAndExpectKeptRebuilt();
  ExpectGradient(loss, x, plain_grad);
  EXPECT_EQ(eps.grad_fn(), nullptr);
}

}  // namespace
}  // namespace mutwo::testing
