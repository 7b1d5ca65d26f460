// The executor: profile -> plan -> execute for every fixture model at
// several budgets, hand-made schedules (everything recomputed, swaps), and
// the refusals. Properties a user relies on: gradients, loss and batch-norm
// statistics equal to the unmodified step; measured peak within the budget
// and close to the planner's prediction.
#include "worker/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "mutwo/v1/types.pb.h"
#include "planner/plan_request.h"
#include "planner/planner.h"
#include "planner/proto_convert.h"
#include "planner/simulator.h"
#include "tests/testing/command.h"
#include "tests/worker/test_models.h"
#include "worker/inputs.h"
#include "worker/memory.h"
#include "worker/profiler.h"

namespace mutwo::testing {
namespace {

using worker::Executor;
using worker::ExecutorOptions;

// The device the tests run on: cpu, or MUTWO_TEST_DEVICE (the `gpu`-labelled
// ctest entry runs this binary with cuda:0).
std::string TestDevice() {
  const char* device = std::getenv("MUTWO_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}

std::vector<v1::TensorSpec> Specs(const TestModel& model) {
  std::vector<v1::TensorSpec> specs;
  for (const std::string& text : model.inputs) {
    auto spec = ParseTensorSpec(text);
    EXPECT_TRUE(spec.ok()) << text;
    specs.push_back(*spec);
  }
  return specs;
}

// The fixture models at batch sizes where activations, not parameters and
// optimizer state, make the peak (so that there is something to save).
TestModel Model(const std::string& name) {
  static const std::map<std::string, int> batch = {{"mlp", 256},
                                                   {"cnn", 8},
                                                   {"transformer", 4},
                                                   {"control_flow", 256},
                                                   {"two_inputs", 512}};
  for (TestModel m : TestModels()) {
    if (m.name != name) continue;
    auto it = batch.find(name);
    if (it != batch.end()) m.batch = it->second;
    // A CUDA step holds tens of MB that no schedule touches (library
    // workspaces, allocator blocks): 64x the batch makes activations count.
    if (TestDevice() != "cpu") m.batch *= 64;
    return m;
  }
  ADD_FAILURE() << "no fixture model " << name;
  return TestModel();
}

// One profile per model, shared by the tests (profiling is the slow part).
// Profiles hold absolute allocator figures: call this before loading a
// second copy of the model (an Executor), or the copy's parameters count.
// `optimizer`: ParseOptimizerSpec's text; empty: none.
const v1::Profile& ProfileOf(const TestModel& model,
                             const std::string& optimizer = "",
                             bool specialize = false) {
  static auto* cache = new std::map<std::string, v1::Profile>();
  std::string key = absl::StrCat(model.name, " ", model.batch, " ", model.loss,
                                 " ", optimizer, " ", specialize);
  for (const std::string& input : model.inputs) absl::StrAppend(&key, input);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  worker::ProfilerOptions options;
  options.model_path = ModelPath(model.name);
  options.inputs = Specs(model);
  auto loss = ParseLossSpec(model.loss);
  EXPECT_TRUE(loss.ok());
  options.loss = *loss;
  if (!optimizer.empty()) {
    auto spec = ParseOptimizerSpec(optimizer);
    EXPECT_TRUE(spec.ok()) << optimizer;
    options.optimizer = *spec;
  }
  options.batch_size = model.batch;
  options.warmup_iterations = 1;
  options.measure_iterations = 1;
  options.device = TestDevice();
  options.specialize_control_flow = specialize;
  auto profiler = worker::Profiler::Create(options);
  EXPECT_TRUE(profiler.ok()) << profiler.status();
  auto profile = (*profiler)->Run();
  EXPECT_TRUE(profile.ok()) << profile.status();
  return (*cache)[key] = *profile;
}

std::unique_ptr<Executor> MakeExecutor(const TestModel& model,
                                       const std::string& optimizer = "",
                                       bool run_baseline = true,
                                       int warmup_iterations = 1,
                                       bool specialize = false) {
  ExecutorOptions options;
  options.specialize_control_flow = specialize;
  options.model_path = ModelPath(model.name);
  options.inputs = Specs(model);
  auto loss = ParseLossSpec(model.loss);
  EXPECT_TRUE(loss.ok());
  options.loss = *loss;
  if (!optimizer.empty()) {
    auto spec = ParseOptimizerSpec(optimizer);
    EXPECT_TRUE(spec.ok()) << optimizer;
    options.optimizer = *spec;
  }
  options.run_baseline = run_baseline;
  options.batch_size = model.batch;
  options.warmup_iterations = warmup_iterations;
  options.measure_iterations = 1;
  options.device = TestDevice();
  auto executor = Executor::Create(options);
  EXPECT_TRUE(executor.ok()) << executor.status();
  return executor.ok() ? *std::move(executor) : nullptr;
}

v1::Schedule Plan(const v1::Profile& profile, int64_t budget_bytes) {
  planner::ScheduleRequest request;
  request.budget.set_bytes(budget_bytes);
  request.max_timeline_samples = 0;
  auto schedule = planner::PlanSchedule(profile, request);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return *schedule;
}

void ExpectCorrect(const v1::Validation& v, const std::string& what) {
  EXPECT_FALSE(v.oom()) << what << ": " << v.error();
  EXPECT_TRUE(v.gradients_match())
      << what << ": max |grad diff| " << v.max_abs_grad_diff();
  EXPECT_LE(v.loss_diff(), 1e-6) << what;
  EXPECT_TRUE(v.batchnorm_stats_match()) << what;
}

// The planner's floor (the lowest feasible budget) and the baseline peak
// (at least the floor: on CUDA the floor includes the allocator reserve and
// may pass the baseline peak on small models); the tests plan at these
// fractions of the gap between them.
std::pair<int64_t, int64_t> FloorAndTop(const v1::Profile& profile) {
  const v1::Schedule baseline = Plan(profile, int64_t{1} << 50);
  return {baseline.floor_bytes(),
          std::max(baseline.baseline_peak_bytes(), baseline.floor_bytes())};
}
constexpr double kBudgetFractions[] = {0.0, 0.25, 0.5, 0.75, 0.95};

class PlannedScheduleTest : public ::testing::TestWithParam<TestModel> {};

// profile -> plan at 5 budgets from the floor to the baseline -> execute:
// loss, gradients and batch-norm statistics equal to the baseline step.
TEST_P(PlannedScheduleTest, MatchesBaseline) {
  const TestModel& model = GetParam();
  const v1::Profile& profile = ProfileOf(model);
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  const auto [floor, top] = FloorAndTop(profile);
  // (On CUDA the floor includes the allocator reserve and may reach the
  // baseline of a small model: then there is nothing between them to plan.)
  if (TestDevice() != "cpu" && floor >= top) {
    GTEST_SKIP() << model.name << ": floor " << floor << " >= baseline " << top;
  }
  // Five budgets, five different schedules: each fixture here has a gap
  // between its floor and its baseline (those without one are
  // FlatPeakTest's).
  ASSERT_LT(floor, top) << model.name;
  int recomputing_schedules = 0;
  for (double f : kBudgetFractions) {
    const int64_t budget = floor + static_cast<int64_t>(f * (top - floor));
    const v1::Schedule schedule = Plan(profile, budget);
    const std::string what = absl::StrCat(
        model.name, " budget ", budget, " (floor ", floor, ", baseline ", top,
        "), ", schedule.recomputed(), " recomputed");
    ASSERT_TRUE(schedule.feasible()) << what;
    auto validation = executor->Run(schedule);
    ASSERT_TRUE(validation.ok()) << what << ": " << validation.status();
    const v1::Validation& v = *validation;
    std::cout << what << ": measured " << v.scheduled().peak_bytes()
              << " (baseline " << v.baseline().peak_bytes() << "), predicted "
              << v.predicted().peak_bytes() << ", grad diff "
              << v.max_abs_grad_diff() << "\n";
    ExpectCorrect(v, what);
    EXPECT_GT(v.scheduled().peak_bytes(), 0) << what;
    // (On a GPU the planner may swap instead.)
    recomputing_schedules += schedule.recomputed() + schedule.swapped() > 0;
  }
  EXPECT_GT(recomputing_schedules, 0) << model.name;
}

// The memory promise: measured peak (counting allocator) <= budget
// and within 10 % of the planner's prediction, at the same 5 budgets.
class PlannedMemoryTest : public ::testing::TestWithParam<TestModel> {};

TEST_P(PlannedMemoryTest, PeakFitsBudgetAndPrediction) {
  const TestModel& model = GetParam();
  const v1::Profile& profile = ProfileOf(model);
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  const auto [floor, top] = FloorAndTop(profile);
  for (double f : kBudgetFractions) {
    const int64_t budget = floor + static_cast<int64_t>(f * (top - floor));
    auto v = executor->Run(Plan(profile, budget));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_LE(v->scheduled().peak_bytes(), budget) << model.name;
    // Within 10% above the prediction. Below it by up to 20%: the planner
    // holds incoming gradients as long as the plain step it profiled, and
    // the executor frees them once consumed. At these fixtures' sizes that
    // is a tenth of the step (cnn at 95% of the way to the baseline, when
    // the profile's timings lead the planner to recompute only the first
    // convolution: 680,371 B measured, 773,555 B predicted).
    const double predicted = static_cast<double>(v->predicted().peak_bytes());
    const double measured = static_cast<double>(v->scheduled().peak_bytes());
    EXPECT_LE(measured, 1.10 * predicted) << model.name << " budget " << budget;
    EXPECT_GE(measured, 0.80 * predicted) << model.name << " budget " << budget;
  }
}

INSTANTIATE_TEST_SUITE_P(FixtureModels, PlannedScheduleTest,
                         ::testing::Values(Model("mlp"), Model("cnn"),
                                           Model("transformer")),
                         [](const ::testing::TestParamInfo<TestModel>& info) {
                           return info.param.name;
                         });

INSTANTIATE_TEST_SUITE_P(FixtureModels, PlannedMemoryTest,
                         ::testing::Values(Model("mlp"), Model("cnn"),
                                           Model("transformer")),
                         [](const ::testing::TestParamInfo<TestModel>& info) {
                           return info.param.name;
                         });

// The loss inside the plan: with chunked_cross_entropy the step holds no
// log-softmax of the whole output (one logits tensor, [B,16,1000] floats),
// and the logits' gradient is written over the logits (another), so the
// transformer's unscheduled peak (set at the loss's backward) drops by about
// two logits tensors (5.02 -> 3.14 MB; 4.00 MB without the reuse) and its
// floor drops too; schedules planned from that profile, at the floor and
// halfway up, execute within their budgets with the baseline step's loss
// and gradients.
TEST(ChunkedLossTest, ThePeakDropsByTheLogitsAndSchedulesHold) {
  TestModel plain = Model("transformer");
  plain.batch = TestDevice() == "cpu" ? 16 : plain.batch;
  TestModel chunked = plain;
  chunked.loss = "chunked_cross_entropy:y:int64[B,16]{0,1000}";
  const int64_t logits_bytes = plain.batch * 16 * 1000 * 4;
  const auto [plain_floor, plain_top] = FloorAndTop(ProfileOf(plain));
  const v1::Profile& profile = ProfileOf(chunked);
  const auto [floor, top] = FloorAndTop(profile);
  std::cout << "logits " << logits_bytes << " B; floor " << plain_floor
            << " -> " << floor << ", baseline " << plain_top << " -> " << top
            << "\n";
  EXPECT_LE(top, plain_top - logits_bytes * 16 / 10);
  EXPECT_LT(floor, plain_floor);
  auto executor = MakeExecutor(chunked);
  ASSERT_NE(executor, nullptr);
  for (double f : {0.0, 0.5}) {
    const int64_t budget = floor + static_cast<int64_t>(f * (top - floor));
    const v1::Schedule schedule = Plan(profile, budget);
    ASSERT_TRUE(schedule.feasible()) << budget;
    auto v = executor->Run(schedule);
    ASSERT_TRUE(v.ok()) << v.status();
    const std::string what = absl::StrCat("chunked loss, budget ", budget, ", ",
                                          schedule.recomputed(), " recomputed");
    std::cout << what << ": measured " << v->scheduled().peak_bytes()
              << ", predicted " << v->predicted().peak_bytes() << "\n";
    ExpectCorrect(*v, what);
    EXPECT_LE(v->scheduled().peak_bytes(), budget) << what;
  }
}

// control_flow and two_inputs peak where every activation is in use: their
// floor is their baseline, and the plan there retains everything. Planned
// once (five budgets would give five copies of one schedule) and run:
// gradients equal, peak within the budget.
class FlatPeakTest : public ::testing::TestWithParam<TestModel> {};

TEST_P(FlatPeakTest, FloorIsTheBaselineAndThePlanRetainsEverything) {
  const TestModel& model = GetParam();
  const v1::Profile& profile = ProfileOf(model);
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  const auto [floor, top] = FloorAndTop(profile);
  EXPECT_EQ(floor, top) << model.name;
  const v1::Schedule schedule = Plan(profile, floor);
  ASSERT_TRUE(schedule.feasible()) << model.name;
  EXPECT_EQ(schedule.recomputed() + schedule.swapped(), 0) << model.name;
  auto validation = executor->Run(schedule);
  ASSERT_TRUE(validation.ok()) << validation.status();
  ExpectCorrect(*validation, model.name);
  // Measured peak within the budget and PlannedMemoryTest's margins of
  // the prediction.
  const double measured =
      static_cast<double>(validation->scheduled().peak_bytes());
  const double predicted =
      static_cast<double>(validation->predicted().peak_bytes());
  EXPECT_LE(measured, static_cast<double>(floor)) << model.name;
  EXPECT_LE(measured, 1.10 * predicted) << model.name;
  EXPECT_GE(measured, 0.80 * predicted) << model.name;
  // The prediction comes with the unscheduled step it was made against
  // (the profile's), so its overhead reads beside the measured one.
  EXPECT_GT(schedule.baseline_iteration_ms(), 0) << model.name;
  EXPECT_EQ(validation->predicted_baseline().iteration_ms(),
            schedule.baseline_iteration_ms());
  EXPECT_EQ(validation->predicted_baseline().peak_bytes(),
            schedule.baseline_peak_bytes());
}

INSTANTIATE_TEST_SUITE_P(FixtureModels, FlatPeakTest,
                         ::testing::Values(Model("control_flow"),
                                           Model("two_inputs")),
                         [](const ::testing::TestParamInfo<TestModel>& info) {
                           return info.param.name;
                         });

// The planner's baseline policies (sqrt_n, per_block) run by the same
// executor: memory as predicted (within 10 %), within the budget, below the
// unmodified step's measured peak, gradients equal. Whole blocks recomputed
// are where a segment's replay used to hold more than the plain step (its
// incoming gradients through the replay's backward, the replayed outputs,
// a second copy of outputs kept for a later segment). ResNet-18 at 128x128,
// batch 4: activations are a fifth of the peak (parameters and gradients
// the rest), enough for the savings to show.
struct PolicyCase {
  TestModel model;
  v1::Policy policy = v1::SQRT_N;
};

void PrintTo(const PolicyCase& c, std::ostream* os) {
  *os << c.model.name << " " << v1::Policy_Name(c.policy);
}

TestModel SmallResNet18() {
  TestModel m = Model("resnet18");
  m.inputs = {"x:float32[B,3,128,128]"};
  m.batch = 4;
  return m;
}

// Bottleneck blocks (ResNet-50, 64x64, cross entropy): a segment's replay
// reads an earlier segment's output (the previous block's output is its
// conv1 input and identity), so the earlier segment replays in the middle of
// the later one's backward, where the planner puts it; and the block output's
// incoming gradient is accumulated with the next block's conv1 gradient
// inside the replay. sqrt_n measured 316 849 234 B against 304 268 370 B
// predicted at batch 32 before both were fixed.
TestModel SmallResNet50() {
  TestModel m;
  m.name = "resnet50";
  m.inputs = {"x:float32[B,3,64,64]"};
  m.loss = "cross_entropy:y:int64[B]{0,1000}";
  m.batch = 16;
  return m;
}

class PolicyMemoryTest : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(PolicyMemoryTest, PeakAsPredictedAndBelowTheBaseline) {
  const PolicyCase& c = GetParam();
  const v1::Profile& profile = ProfileOf(c.model);
  auto executor = MakeExecutor(c.model);
  ASSERT_NE(executor, nullptr);
  planner::ScheduleRequest request;
  request.policy = c.policy;
  request.budget.set_bytes(
      Plan(profile, int64_t{1} << 50).baseline_peak_bytes());
  request.max_timeline_samples = 0;
  auto schedule = planner::PlanSchedule(profile, request);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const std::string what =
      absl::StrCat(c.model.name, " ", v1::Policy_Name(c.policy), ", ",
                   schedule->recomputed(), " recomputed");
  ASSERT_TRUE(schedule->feasible()) << what;
  ASSERT_GT(schedule->recomputed(), 0) << what;
  auto v = executor->Run(*schedule);
  ASSERT_TRUE(v.ok()) << what << ": " << v.status();
  std::cout << what << ": measured " << v->scheduled().peak_bytes()
            << " (baseline " << v->baseline().peak_bytes() << "), predicted "
            << v->predicted().peak_bytes() << ", budget " << v->budget_bytes()
            << "\n";
  const double predicted = static_cast<double>(v->predicted().peak_bytes());
  // (The executor compares with deterministic cuDNN algorithms: on CUDA
  // too the scheduled step's gradients equal the plain step's.)
  ExpectCorrect(*v, what);
  if (TestDevice() == "cpu") {
    // The counting allocator sees what the profile saw: no more than the
    // prediction (+1 %).
    EXPECT_LE(static_cast<double>(v->scheduled().peak_bytes()),
              1.01 * predicted)
        << what;
  }
  EXPECT_LE(v->scheduled().peak_bytes(), v->budget_bytes()) << what;
  EXPECT_LT(v->scheduled().peak_bytes(), v->baseline().peak_bytes()) << what;
  EXPECT_NEAR(static_cast<double>(v->scheduled().peak_bytes()), predicted,
              0.10 * predicted)
      << what;
}

INSTANTIATE_TEST_SUITE_P(
    Policies, PolicyMemoryTest,
    ::testing::Values(PolicyCase{Model("cnn"), v1::SQRT_N},
                      PolicyCase{Model("cnn"), v1::PER_BLOCK},
                      PolicyCase{SmallResNet18(), v1::SQRT_N},
                      PolicyCase{SmallResNet18(), v1::PER_BLOCK},
                      PolicyCase{SmallResNet50(), v1::SQRT_N}),
    [](const ::testing::TestParamInfo<PolicyCase>& info) {
      return absl::StrCat(info.param.model.name, "_",
                          v1::Policy_Name(info.param.policy));
    });

// μ-TWO's own schedules on ResNet-18 (128x128, batch 32, cross entropy,
// SGD): activations are most of the peak, and the greedy picks scattered
// batch norms whose outputs a later segment reads (a block's output is the
// next block's identity) or that in-place ops write after a downsample
// (`out += identity; relu_(out)`). Those used to stay resident while the
// planner counted them freed (263 362 399 B measured against 254 973 791 B
// predicted at a 255 000 000 B budget).
TestModel ResNet18Batch32() {
  TestModel m = Model("resnet18");
  m.inputs = {"x:float32[B,3,128,128]"};
  m.loss = "cross_entropy:y:int64[B]{0,1000}";
  m.batch = 32;
  return m;
}
constexpr char kSgd[] = "sgd";

// The measured peak as the planner predicts it: within the budget, within
// 10 % of the prediction, and (on the CPU's counting allocator, where the
// model is exact) at most 1 % above it: the bug this guards against was a
// single 8 MiB activation, 3 %.
void ExpectPeakAsPredicted(const v1::Validation& v, int64_t budget,
                           const std::string& what) {
  const int64_t measured = v.scheduled().peak_bytes();
  const double predicted = static_cast<double>(v.predicted().peak_bytes());
  std::cout << what << ": measured " << measured << ", predicted "
            << v.predicted().peak_bytes() << ", budget " << budget << "\n";
  EXPECT_FALSE(v.oom()) << what << ": " << v.error();
  EXPECT_LE(measured, budget) << what;
  EXPECT_NEAR(static_cast<double>(measured), predicted, 0.10 * predicted)
      << what;
  if (TestDevice() == "cpu") {
    EXPECT_LE(static_cast<double>(measured), 1.01 * predicted) << what;
  }
}

TEST(MutwoResNetMemoryTest, PlannedPeakFitsBudgetAndPrediction) {
  const TestModel model = ResNet18Batch32();
  const v1::Profile& profile = ProfileOf(model, kSgd);
  // Memory only (no baseline step): the gradients are checked below.
  // (No warm-up: the first step's peak is the same on this model.)
  auto executor = MakeExecutor(model, kSgd, /*run_baseline=*/false,
                               /*warmup_iterations=*/0);
  ASSERT_NE(executor, nullptr);
  const auto [floor, top] = FloorAndTop(profile);
  for (double f : kBudgetFractions) {
    const int64_t budget = floor + static_cast<int64_t>(f * (top - floor));
    const v1::Schedule schedule = Plan(profile, budget);
    const std::string what = absl::StrCat(
        "resnet18 budget ", budget, " (floor ", floor, ", baseline ", top,
        "), ", schedule.recomputed(), " recomputed");
    ASSERT_TRUE(schedule.feasible()) << what;
    if (f < 0.9) {  // (on a GPU the planner may swap instead)
      EXPECT_GT(schedule.recomputed() + schedule.swapped(), 0) << what;
    }
    auto v = executor->Run(schedule);
    ASSERT_TRUE(v.ok()) << what << ": " << v.status();
    ExpectPeakAsPredicted(*v, budget, what);
  }
}

// Recomputes the activations whose producer node `recompute` accepts
// (nothing else, one segment per planner segment), with the planner's
// prediction.
v1::Schedule RecomputeWhere(
    const v1::Profile& profile,
    const std::function<bool(const v1::ProfileNode&)>& recompute) {
  auto plan_profile = planner::ProfileFromProto(profile);
  EXPECT_TRUE(plan_profile.ok()) << plan_profile.status();
  if (!plan_profile.ok()) return v1::Schedule();
  auto sim = planner::Simulator::Create(&*plan_profile);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return v1::Schedule();
  planner::PlanResult result;
  result.decisions.resize(plan_profile->activations.size());
  for (size_t i = 0; i < plan_profile->activations.size(); ++i) {
    const int producer = plan_profile->activations[i].producer_node;
    if (recompute(profile.nodes(producer))) {
      result.decisions[i].action = planner::Action::kRecompute;
    }
  }
  result.sim = (*sim)->Run(result.decisions);
  result.feasible = true;
  result.budget_bytes = result.sim.peak_bytes;
  result.floor_bytes = result.sim.peak_bytes;
  result.baseline_peak_bytes = (*sim)->baseline_peak_bytes();
  v1::MemoryBudget budget;
  budget.set_bytes(result.sim.peak_bytes);
  return planner::ScheduleToProto(profile, *plan_profile, result, budget,
                                  /*max_timeline_samples=*/0);
}

// Recomputes the activations of the nodes named by `scopes`.
v1::Schedule RecomputeScopes(const v1::Profile& profile,
                             const std::set<std::string>& scopes) {
  std::set<std::string> found;
  v1::Schedule schedule =
      RecomputeWhere(profile, [&](const v1::ProfileNode& node) {
        if (scopes.count(node.scope()) == 0) return false;
        found.insert(node.scope());
        return true;
      });
  EXPECT_EQ(found, scopes);
  return schedule;
}
// The cases behind the gap, by hand: gradients and batch-norm statistics
// equal to the plain step, memory as predicted and below the plain step.
TEST(MutwoResNetMemoryTest, ScatteredBlockOutputsAsPredicted) {
  // Hand-made schedules whose savings are a few MB, checked against budgets
  // equal to their predictions: byte-exact only with the CPU's counting
  // allocator (the CUDA caching allocator rounds blocks by up to ~2 MB).
  if (TestDevice() != "cpu") GTEST_SKIP() << "byte-exact: the CPU only";
  const TestModel model = ResNet18Batch32();
  const v1::Profile& profile = ProfileOf(model, kSgd);
  auto executor = MakeExecutor(model, kSgd, /*run_baseline=*/true,
                               /*warmup_iterations=*/0);
  ASSERT_NE(executor, nullptr);
  const std::vector<std::set<std::string>> cases = {
      // A block's output read by the next block's segment (its identity in
      // `out += identity`, which that segment replays): kept until that
      // segment's replay, then freed until its own.
      {"layer1.0.bn2", "layer1.1.bn2"},
      // `out += identity; relu_(out)` after the downsample: the replay
      // applies them (and rebuilds the identity from the kept convolution).
      {"layer2.0.bn2"},
      // ... reading the identity from the same segment's replay,
      {"layer2.0.bn2", "layer2.0.downsample.0"},
      // ... and capturing it where another segment starts.
      {"layer2.0.bn2", "layer2.0.downsample.1"},
  };
  for (const auto& scopes : cases) {
    const v1::Schedule schedule = RecomputeScopes(profile, scopes);
    std::string what = "resnet18 recomputing";
    for (const std::string& scope : scopes) absl::StrAppend(&what, " ", scope);
    ASSERT_EQ(schedule.recomputed(), static_cast<int>(scopes.size())) << what;
    auto v = executor->Run(schedule);
    ASSERT_TRUE(v.ok()) << what << ": " << v.status();
    ExpectCorrect(*v, what);
    ExpectPeakAsPredicted(*v, schedule.budget_bytes(), what);
    EXPECT_LT(v->scheduled().peak_bytes(), v->baseline().peak_bytes()) << what;
  }
}

// A segment whose range writes the last stage's output into the feature
// dict and reads the dict's entries, with the other head reading an entry
// after the range (LRASPP's head at its floor): the dict dies inside the
// range, and the segment has nothing to write back.
TEST(ExecutorTest, ASegmentOverAFeatureDictsWriteAndLastRead) {
  const TestModel model = Model("feature_dict");
  const v1::Profile& profile = ProfileOf(model);
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  // The ReLUs of the last stage and of the head: one segment from stage
  // c's linear to the head's ReLU.
  int relus = 0;
  const v1::Schedule schedule =
      RecomputeWhere(profile, [&](const v1::ProfileNode& node) {
        return node.kind() == "aten::relu" && ++relus >= 3;
      });
  ASSERT_EQ(schedule.recomputed(), 2);
  auto v = executor->Run(schedule);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectCorrect(*v, "feature_dict recomputing stage c and the head");
}

// A schedule for `profile` without decisions, and one decision (RETAIN)
// for activation `a`, for the hand-made schedules below.
v1::Schedule ScheduleFor(const v1::Profile& profile) {
  v1::Schedule schedule;
  schedule.set_graph_fingerprint(profile.graph_fingerprint());
  schedule.set_batch_size(profile.batch_size());
  return schedule;
}
v1::Decision* AddDecision(v1::Schedule& schedule, const v1::Activation& a) {
  v1::Decision* d = schedule.add_decisions();
  d->set_value_id(a.value_id());
  d->set_producer_node(a.producer_node());
  d->set_size_bytes(a.size_bytes());
  d->set_action(v1::Decision::RETAIN);
  return d;
}

// Two segments, the second starting with a dropout of probability 0 over
// the first's output: ATen returns its input itself (an alias no schema
// announces) and sin saves it. The first segment's output stays pinned
// until the second replays and is freed then; sin's backward, inside the
// second's replay, must bring it back first (gcvit_tiny on an H200 failed
// "data is not allocated"; on the CPU it read freed memory).
TEST(ExecutorTest, ASegmentReadingAnEarlierOutputThroughARuntimeAlias) {
  const TestModel model{"dropout_alias", {"x:float32[B,16]"}, "mean", 64};
  const v1::Profile& profile = ProfileOf(model);
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  int relu = -1, dropout = -1, sin = -1;
  for (const v1::ProfileNode& node : profile.nodes()) {
    if (node.kind() == "aten::relu" && relu < 0) relu = node.id();
    if (node.kind() == "aten::dropout") dropout = node.id();
    if (node.kind() == "aten::sin") sin = node.id();
  }
  ASSERT_GE(relu, 0);
  ASSERT_GE(dropout, 0);
  ASSERT_GE(sin, 0);
  v1::Schedule schedule = ScheduleFor(profile);
  for (const v1::Activation& a : profile.activations()) {
    v1::Decision* d = AddDecision(schedule, a);
    if (a.producer_node() == relu) {
      d->set_action(v1::Decision::RECOMPUTE);
      d->set_segment(0);
      for (int n : a.recompute_nodes()) d->add_recompute_nodes(n);
    } else if (a.producer_node() == sin) {
      d->set_action(v1::Decision::RECOMPUTE);
      d->set_segment(1);
      d->add_recompute_nodes(dropout);
      d->add_recompute_nodes(sin);
    }
  }
  auto v = executor->Run(schedule);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectCorrect(*v, "dropout_alias in two segments");
  EXPECT_EQ(v->recomputed(), 2);
}

// Every activation of an op node recomputed: one segment over the graph.
v1::Schedule AllRecomputed(const v1::Profile& profile) {
  v1::Schedule schedule = ScheduleFor(profile);
  for (const v1::Activation& a : profile.activations()) {
    v1::Decision* d = AddDecision(schedule, a);
    if (profile.nodes(a.producer_node()).is_op()) {
      d->set_action(v1::Decision::RECOMPUTE);
      d->set_segment(0);
      for (int n : a.recompute_nodes()) d->add_recompute_nodes(n);
    }
  }
  return schedule;
}

class AllRecomputedTest : public ::testing::TestWithParam<TestModel> {};

TEST_P(AllRecomputedTest, MatchesBaseline) {
  const TestModel& model = GetParam();
  const v1::Profile& profile = ProfileOf(model);  // before a second copy
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  auto v = executor->Run(AllRecomputed(profile));
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectCorrect(*v, model.name);
  EXPECT_GT(v->recomputed(), 0);
}

INSTANTIATE_TEST_SUITE_P(FixtureModels, AllRecomputedTest,
                         ::testing::Values(Model("mlp"), Model("cnn"),
                                           Model("transformer"),
                                           Model("control_flow"),
                                           Model("two_inputs")),
                         [](const ::testing::TestParamInfo<TestModel>& info) {
                           return info.param.name;
                         });

// The planner never swaps on CPU (no bandwidth): swaps by hand, of every
// op activation that is not used by the loss, offloaded after its last
// forward use and prefetched at its first backward use.
v1::Schedule Swapped(const v1::Profile& profile, bool every_other_recompute) {
  v1::Schedule schedule = ScheduleFor(profile);
  const int n = profile.nodes_size();
  int k = 0;
  for (const v1::Activation& a : profile.activations()) {
    v1::Decision* d = AddDecision(schedule, a);
    if (!profile.nodes(a.producer_node()).is_op() ||
        a.last_forward_use() >= n - 1) {
      continue;
    }
    if (every_other_recompute && k++ % 2 == 1) {
      d->set_action(v1::Decision::RECOMPUTE);
      d->set_segment(a.producer_node());  // one segment per node
      for (int r : a.recompute_nodes()) d->add_recompute_nodes(r);
      continue;
    }
    d->set_action(v1::Decision::SWAP);
    d->set_offload_after(a.last_forward_use());
    d->set_prefetch_at(a.first_backward_use());
    d->set_needed_at(a.first_backward_use());
  }
  return schedule;
}

TEST(ExecutorSwapTest, SwapsKeepGradientsAndLowerThePeak) {
  for (const char* name : {"cnn", "mlp", "transformer", "feature_dict"}) {
    const TestModel model = Model(name);
    const v1::Profile& profile = ProfileOf(model);  // before a second copy
    auto executor = MakeExecutor(model);
    ASSERT_NE(executor, nullptr);
    auto v = executor->Run(Swapped(profile, false));
    ASSERT_TRUE(v.ok()) << v.status();
    ExpectCorrect(*v, name);
    EXPECT_GT(v->swapped(), 0) << name;
    // (The transformer peaks where nothing can be swapped: the 1000-way
    // head output and the loss; feature_dict at its heads' backward. Its
    // stage outputs leave once no value holds them, before the heads'
    // static reads of the dict: gradients stay equal.)
    if (std::string(name) != "transformer" &&
        std::string(name) != "feature_dict") {
      EXPECT_LT(v->scheduled().peak_bytes(), v->baseline().peak_bytes())
          << name;
    }
  }
}

TEST(ExecutorSwapTest, SwapsAndRecomputeTogether) {
  for (const char* name : {"cnn", "control_flow"}) {
    const TestModel model = Model(name);
    const v1::Profile& profile = ProfileOf(model);  // before a second copy
    auto executor = MakeExecutor(model);
    ASSERT_NE(executor, nullptr);
    auto v = executor->Run(Swapped(profile, true));
    ASSERT_TRUE(v.ok()) << v.status();
    ExpectCorrect(*v, name);
    EXPECT_GT(v->swapped(), 0) << name;
  }
}

// Issue 13: with control flow specialised (the default), the transformer's
// encoder layers (one prim::If each before) are planned op by op: at the
// floor the schedule recomputes activations of several kinds inside the
// layers, and the step matches the plain one within the budget.
TEST(SpecializedControlFlowTest, TransformerLayersArePlannedOpByOp) {
  const TestModel model = Model("transformer");
  const v1::Profile& profile = ProfileOf(model, "", /*specialize=*/true);
  for (const v1::ProfileNode& node : profile.nodes()) {
    ASSERT_NE(node.kind(), "prim::If") << node.id() << " " << node.scope();
  }
  auto executor = MakeExecutor(model, "", true, 1, /*specialize=*/true);
  ASSERT_NE(executor, nullptr);
  EXPECT_EQ(executor->graph_fingerprint(), profile.graph_fingerprint());
  const int64_t floor = FloorAndTop(profile).first;
  const v1::Schedule schedule = Plan(profile, floor);
  ASSERT_TRUE(schedule.feasible());
  std::set<std::string> kinds;
  std::set<std::string> layers;
  for (const v1::Decision& d : schedule.decisions()) {
    if (d.action() != v1::Decision::RECOMPUTE) continue;
    const v1::ProfileNode& node = profile.nodes(d.producer_node());
    if (node.scope().rfind("encoder.layers.", 0) != 0) continue;
    kinds.insert(node.kind());
    layers.insert(node.scope().substr(0, 16));  // "encoder.layers.N"
  }
  EXPECT_GE(kinds.size(), 2u);
  EXPECT_EQ(layers.size(), 2u);
  auto v = executor->Run(schedule);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectCorrect(*v, "transformer at the floor");
  if (TestDevice() == "cpu") {
    EXPECT_LE(v->scheduled().peak_bytes(), floor);
  }
}

// branchy takes one path or the other by the sign of its input's sum: an
// executor on inputs (another seed) that take the other path builds
// another graph, and refuses the schedule of the profile by its
// fingerprint instead of running ops the schedule does not describe.
TEST(SpecializedControlFlowTest, InputsThatTakeTheOtherBranchAreRefused) {
  TestModel model{"branchy", {"x:float32[B,16]"}};
  model.batch = 8;
  const std::vector<v1::TensorSpec> specs = Specs(model);
  // Two seeds whose inputs have sums of opposite signs.
  std::map<bool, uint64_t> seed_of;
  for (uint64_t seed = 0; seed < 64 && seed_of.size() < 2; ++seed) {
    auto x = worker::MakeInputs(specs, model.batch, torch::kCPU, seed);
    ASSERT_TRUE(x.ok());
    seed_of.emplace((*x)[0].sum().item<double>() > 0, seed);
  }
  ASSERT_EQ(seed_of.size(), 2u);
  worker::ProfilerOptions profiling;
  profiling.model_path = ModelPath(model.name);
  profiling.inputs = specs;
  profiling.batch_size = model.batch;
  profiling.measure_iterations = 1;
  profiling.seed = seed_of[true];
  profiling.specialize_control_flow = true;
  auto profiler = worker::Profiler::Create(profiling);
  ASSERT_TRUE(profiler.ok()) << profiler.status();
  auto profile = (*profiler)->Run();
  ASSERT_TRUE(profile.ok()) << profile.status();
  const v1::Schedule schedule = Plan(*profile, int64_t{1} << 40);

  ExecutorOptions options;
  options.model_path = ModelPath(model.name);
  options.inputs = specs;
  options.batch_size = model.batch;
  options.measure_iterations = 1;
  options.seed = seed_of[true];
  options.specialize_control_flow = true;
  auto same = Executor::Create(options);
  ASSERT_TRUE(same.ok()) << same.status();
  auto v = (*same)->Run(schedule);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectCorrect(*v, "branchy, the profiled branch");

  options.seed = seed_of[false];
  auto other = Executor::Create(options);
  ASSERT_TRUE(other.ok()) << other.status();
  auto refused = (*other)->Run(schedule);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("graph fingerprint"),
            std::string::npos)
      << refused.status();
}

TEST(ExecutorTest, RefusesAScheduleOfAnotherGraph) {
  auto executor = MakeExecutor(Model("mlp"));
  ASSERT_NE(executor, nullptr);
  v1::Schedule schedule;
  schedule.set_graph_fingerprint("0123456789abcdef");
  schedule.set_batch_size(Model("mlp").batch);
  auto v = executor->Run(schedule);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("0123456789abcdef"), std::string::npos);
  EXPECT_NE(v.status().message().find(executor->graph_fingerprint()),
            std::string::npos)
      << v.status();
}

TEST(ExecutorTest, RefusesAnotherBatchSizeAndUnknownNodes) {
  const TestModel model = Model("mlp");
  const v1::Profile& profile = ProfileOf(model);  // before a second copy
  auto executor = MakeExecutor(model);
  ASSERT_NE(executor, nullptr);
  v1::Schedule schedule = AllRecomputed(profile);
  schedule.set_batch_size(model.batch + 1);
  auto v = executor->Run(schedule);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("batch size"), std::string::npos);
  schedule.set_batch_size(model.batch);
  schedule.mutable_decisions(0)->set_action(v1::Decision::RECOMPUTE);
  schedule.mutable_decisions(0)->set_producer_node(100000);
  v = executor->Run(schedule);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("100000"), std::string::npos)
      << v.status();
}

TEST(ExecutorTest, OutOfMemoryIsAResult) {
  if (TestDevice() != "cpu") GTEST_SKIP() << "a CPU allocator limit";
  const TestModel model = Model("cnn");
  const v1::Profile& profile = ProfileOf(model);
  ExecutorOptions options;
  options.model_path = ModelPath(model.name);
  options.inputs = Specs(model);
  options.batch_size = model.batch;
  // Room for the model, not for a training step.
  options.memory_limit_bytes = profile.measured().peak_bytes() / 2;
  auto executor = Executor::Create(options);
  absl::StatusOr<v1::Validation> v = absl::UnknownError("not run");
  if (executor.ok()) v = (*executor)->Run(AllRecomputed(profile));
  worker::InstallCountingCpuAllocator(0);  // the other tests need no limit
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->oom());
  EXPECT_NE(v->error().find("memory"), std::string::npos) << v->error();
}

// The command line: a planned schedule from a file, JSON out; a schedule of
// another graph refused with exit 2.
TEST(ExecuteCliTest, RunsAScheduleFileAndRefusesAnotherGraph) {
  if (TestDevice() != "cpu") GTEST_SKIP() << "the CLI on the CPU";
  const TestModel model = Model("mlp");
  const v1::Profile& profile = ProfileOf(model);
  const v1::Schedule probe = Plan(profile, int64_t{1} << 50);
  v1::Schedule schedule = Plan(profile, probe.floor_bytes());
  ASSERT_GT(schedule.recomputed(), 0);
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/executor_cli_schedule.json";
  ASSERT_TRUE(WriteFileAtomically(path, ProtoToJson(schedule)).ok());
  const std::string base =
      absl::StrCat(BinPath("mutwo-worker"), " execute ", ModelPath("mlp"),
                   " --input ", model.inputs[0], " --batch ", model.batch,
                   " --warmup 0 --iterations 1 --output json --schedule ");
  CommandResult r = RunCommand(base + path + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  v1::Validation v;
  ASSERT_TRUE(ProtoFromJson(r.output, "stdout", &v).ok()) << r.output;
  EXPECT_TRUE(v.gradients_match());
  EXPECT_EQ(v.recomputed(), schedule.recomputed());
  EXPECT_EQ(v.budget_bytes(), schedule.budget_bytes());
  EXPECT_NE(r.output.find("\"batchnorm_stats_match\""), std::string::npos);
  EXPECT_NE(r.output.find("\"peak_bytes\""), std::string::npos);

  r = RunCommand(base + path + " --output text");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("gradients       match"), std::string::npos)
      << r.output;

  // Only the scheduled step (for batch sizes where the baseline OOMs).
  r = RunCommand(base + path + " --baseline=false 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  v1::Validation only;
  ASSERT_TRUE(ProtoFromJson(r.output, "stdout", &only).ok()) << r.output;
  EXPECT_TRUE(only.baseline_skipped());
  EXPECT_EQ(only.baseline().peak_bytes(), 0);
  EXPECT_FALSE(only.gradients_match());
  EXPECT_GT(only.scheduled().peak_bytes(), 0);

  schedule.set_graph_fingerprint("ffffffffffffffff");
  ASSERT_TRUE(WriteFileAtomically(path, ProtoToJson(schedule)).ok());
  r = RunCommand(base + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ffffffffffffffff"), std::string::npos) << r.output;
  r = RunCommand(base + dir + "/no_such_schedule.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace mutwo::testing
