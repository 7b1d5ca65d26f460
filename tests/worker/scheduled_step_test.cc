// mutwo::ScheduledStep (include/mutwo/scheduled_step.h) holds every call to
// the step its schedule was planned for: a schedule planned at batch 4 is
// refused at batch 8 (its budget says nothing there), as are another dtype,
// another shape and another number of inputs, each naming the input, its
// shape and the planned one; the planned step runs, before and after a
// refusal. A schedule that records no inputs holds calls to the first's.
#include "mutwo/scheduled_step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/proto_io.h"
#include "mutwo/v1/types.pb.h"
#include "tests/testing/command.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

class ScheduledStepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                            absl::StrCat("scheduled_step_test_", getpid()))
                               .string());
    std::filesystem::create_directories(*dir_);
    std::ofstream(*dir_ + "/make.py") << R"(import sys, torch
class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU())
        self.fc = torch.nn.Linear(16, 10)
    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))
torch.manual_seed(0)
torch.jit.script(Cnn()).save(sys.argv[1] + "/cnn.pt")
)";
    auto run = [](const std::string& command) {
      const auto r = testing::RunCommand(command);
      ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    };
    run(absl::StrCat("/usr/bin/python3 ", *dir_, "/make.py ", *dir_));
    run(absl::StrCat(testing::BinPath("mutwo-worker"), " profile ", *dir_,
                     "/cnn.pt --input x:float32[B,3,16,16] --batch 4 "
                     "--output json > ",
                     *dir_, "/profile.json"));
    run(absl::StrCat(testing::BinPath("mutwo"), " plan ", *dir_,
                     "/profile.json --budget 95% --output json > ", *dir_,
                     "/schedule.json"));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static torch::jit::Module Model() {
    torch::jit::Module m = torch::jit::load(*dir_ + "/cnn.pt");
    m.train();
    return m;
  }
  static ScheduleJson Schedule() {
    return ReadScheduleFile(*dir_ + "/schedule.json");
  }
  static torch::Tensor Loss(const torch::IValue& out) {
    return out.toTensor().pow(2).mean();
  }
  // The message Run threw, or "" when it ran.
  static std::string RunError(ScheduledStep& step,
                              const std::vector<torch::IValue>& inputs) {
    try {
      step.Run(inputs, Loss);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }

  static std::string* dir_;
};
std::string* ScheduledStepTest::dir_ = nullptr;

TEST_F(ScheduledStepTest, ThePlannedStepRunsAndAnotherBatchIsRefused) {
  torch::jit::Module model = Model();
  ScheduledStep step(model, Schedule());
  EXPECT_EQ(RunError(step, {torch::randn({4, 3, 16, 16})}), "");
  EXPECT_THAT(
      RunError(step, {torch::randn({8, 3, 16, 16})}),
      HasSubstr("input 0 (\"x\") is float32[8,3,16,16], the schedule was "
                "planned for float32[4,3,16,16] (batch 4): batch 8 is not "
                "the planned batch 4"));
  // Refused before anything ran: the planned step still runs.
  EXPECT_EQ(RunError(step, {torch::randn({4, 3, 16, 16})}), "");
}

TEST_F(ScheduledStepTest, ARefusalComesBeforeTheFirstStepToo) {
  torch::jit::Module model = Model();
  ScheduledStep step(model, Schedule());
  EXPECT_THAT(RunError(step, {torch::randn({8, 3, 16, 16})}),
              HasSubstr("planned for float32[4,3,16,16] (batch 4)"));
  EXPECT_EQ(RunError(step, {torch::randn({4, 3, 16, 16})}), "");
}

TEST_F(ScheduledStepTest, AnotherDtypeShapeOrInputCountIsRefused) {
  torch::jit::Module model = Model();
  ScheduledStep step(model, Schedule());
  EXPECT_THAT(
      RunError(step, {torch::randn({4, 3, 16, 16}, torch::kFloat64)}),
      HasSubstr("input 0 (\"x\") is float64[4,3,16,16], the schedule was "
                "planned for float32[4,3,16,16]"));
  EXPECT_THAT(RunError(step, {torch::randn({4, 3, 16, 32})}),
              HasSubstr("input 0 (\"x\") is float32[4,3,16,32]"));
  EXPECT_THAT(RunError(step, {torch::randn({4, 3, 16, 16}),
                              torch::randn({4, 3, 16, 16})}),
              HasSubstr("2 inputs given; the schedule was planned for 1 at "
                        "batch 4: x:float32[B,3,16,16]"));
}

TEST_F(ScheduledStepTest, AScheduleWithoutRecordedInputsHoldsToTheFirstCall) {
  v1::Schedule schedule;
  ASSERT_TRUE(ProtoFromJson(Schedule().text, "schedule", &schedule).ok());
  ASSERT_EQ(schedule.inputs_size(), 1);
  schedule.clear_inputs();
  schedule.set_batch_size(0);
  torch::jit::Module model = Model();
  ScheduledStep step(model, ScheduleJson{ProtoToJson(schedule)});
  EXPECT_EQ(RunError(step, {torch::randn({4, 3, 16, 16})}), "");
  EXPECT_THAT(RunError(step, {torch::randn({8, 3, 16, 16})}),
              HasSubstr("is float32[8,3,16,16], the schedule was planned for "
                        "float32[4,3,16,16] (batch 4)"));
}

// The second Run's peak is measured (the device backend's high-water mark
// over forward, loss and backward) and judged against the schedule's
// budget: within it for a loop that releases its gradients before each
// step (the planned step's), over it when the loop's loss holds a tensor
// of the budget's size.
TEST_F(ScheduledStepTest, TheSecondStepsPeakIsMeasuredAgainstTheBudget) {
  v1::Schedule schedule;
  ASSERT_TRUE(ProtoFromJson(Schedule().text, "schedule", &schedule).ok());
  const int64_t budget = schedule.budget_bytes();
  ASSERT_GT(budget, 0);
  const torch::Tensor x = torch::randn({4, 3, 16, 16});
  auto release_grads = [](torch::jit::Module& model) {
    for (torch::Tensor p : model.parameters())
      p.mutable_grad() = torch::Tensor();
  };
  {
    torch::jit::Module model = Model();
    ScheduledStep step(model, Schedule());
    step.Run({x}, Loss);
    EXPECT_EQ(step.measured_peak_bytes(), 0);
    release_grads(model);
    step.Run({x}, Loss);
    const int64_t peak = step.measured_peak_bytes();
    // At least the parameters and the input are resident.
    EXPECT_GT(peak, x.nbytes());
    EXPECT_LE(peak, budget) << "peak " << peak << ", budget " << budget;
    EXPECT_FALSE(step.over_budget());
    step.Run({x}, Loss);
    EXPECT_EQ(step.measured_peak_bytes(), peak);  // the second Run's
  }
  torch::jit::Module model = Model();
  ScheduledStep step(model, Schedule());
  std::vector<torch::Tensor> held;
  auto holding = [&](const torch::IValue& out) {
    held.push_back(torch::zeros({budget / 4 + 1}));
    return Loss(out);
  };
  step.Run({x}, Loss);
  step.Run({x}, holding);
  EXPECT_GT(step.measured_peak_bytes(), budget);
  EXPECT_TRUE(step.over_budget());
}

// A LibTorch loop's loss for a schedule planned with chunked_cross_entropy:
// torch's cross entropy over [B,T,V] logits, loss and gradient; shapes that
// do not fit are refused naming them.
TEST(ChunkedCrossEntropyTest, IsCrossEntropyAndRefusesShapesNamingThem) {
  torch::manual_seed(5);
  torch::Tensor a = (torch::randn({3, 4, 9}) * 2).requires_grad_();
  torch::Tensor b = a.detach().clone().requires_grad_();
  const torch::Tensor y = torch::randint(0, 9, {3, 4});
  const torch::Tensor ours = ChunkedCrossEntropy(a, y);
  const torch::Tensor theirs =
      torch::nn::functional::cross_entropy(b.reshape({-1, 9}), y.reshape({-1}));
  EXPECT_NEAR(ours.item<float>(), theirs.item<float>(), 1e-6);
  ours.backward();
  theirs.backward();
  EXPECT_LE((a.grad() - b.grad()).abs().max().item<float>(), 1e-7);

  // reuse_logits: the same gradient, written over the logits' memory (a
  // leaf, `a` above, is never written over).
  torch::Tensor h = torch::randn({3, 4, 9}).requires_grad_();
  torch::Tensor h_ref = h.detach().clone().requires_grad_();
  torch::nn::functional::cross_entropy((h_ref * 2).reshape({-1, 9}),
                                       y.reshape({-1}))
      .backward();
  torch::Tensor logits = h * 2;
  void* grad_data = nullptr;
  logits.register_hook([&](const torch::Tensor& g) {
    grad_data = g.data_ptr();
    return torch::Tensor();
  });
  ChunkedCrossEntropy(logits, y, /*reuse_logits=*/true).backward();
  EXPECT_EQ(grad_data, logits.data_ptr());
  EXPECT_LE((h.grad() - h_ref.grad()).abs().max().item<float>(), 1e-6);
  try {
    ChunkedCrossEntropy(torch::randn({2, 5, 3, 3}),
                        torch::zeros({2, 3, 3}, torch::kLong));
    ADD_FAILURE() << "classes in dimension 1 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("logits [2,5,3,3] (Float) and target "
                                    "[2,3,3] (Long) do not fit"));
  }
  EXPECT_THROW(ChunkedCrossEntropy(torch::randn({4, 9}), torch::zeros({4})),
               std::runtime_error);  // float targets
}

}  // namespace
}  // namespace mutwo
