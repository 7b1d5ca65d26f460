// `mutwo plan` end to end: a profile JSON written here, the real binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <regex>
#include <string>

#include "absl/strings/str_replace.h"
#include "common/proto_io.h"
#include "tests/planner/proto_profile.h"
#include "tests/planner/test_profiles.h"
#include "tests/testing/command.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo {
namespace {

using ::mutwo::testing::BinPath;
using ::mutwo::testing::RunCommand;

int CountOf(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos;
       at = text.find(part, at + part.size())) {
    ++count;
  }
  return count;
}

class PlanCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        ::testing::TempDir() + "plan_command_test_" + std::to_string(getpid());
    ASSERT_EQ(RunCommand("mkdir -p " + dir_).exit_code, 0);
    profile_ = dir_ + "/profile.json";
    ASSERT_TRUE(WriteFileAtomically(
                    profile_, ProtoToJson(planner::testing::DiamondProto()))
                    .ok());
  }
  void TearDown() override { RunCommand("rm -rf " + dir_); }

  testing::CommandResult Plan(const std::string& args) {
    // The Diamond profile is 1 KB: the CPU reserve (16 KiB) would leave
    // nothing of any budget.
    return RunCommand(BinPath("mutwo") + " plan --reserve=false " + args);
  }

  std::string dir_;
  std::string profile_;
};

TEST_F(PlanCommandTest, FeasibleJson) {
  auto r = Plan(profile_ + " --budget 70% --output json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"feasible\": true"), std::string::npos);
  EXPECT_NE(r.output.find("\"planner_version\""), std::string::npos);
  EXPECT_NE(r.output.find("\"graph_fingerprint\": \"fp-diamond\""),
            std::string::npos);
  EXPECT_NE(r.output.find("\"action\": \"RECOMPUTE\""), std::string::npos);
}

TEST_F(PlanCommandTest, TextSummaryAndBaselinePolicies) {
  auto r = Plan(profile_ + " --budget 700B --pareto");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("feasible        yes"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("pareto"), std::string::npos);
  r = Plan(profile_ + " --budget 100% --policy none");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0 recompute"), std::string::npos) << r.output;
}

TEST_F(PlanCommandTest, InfeasibleBudgetExits3WithTheFloor) {
  auto r = Plan(profile_ + " --budget 100B");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("below the floor"), std::string::npos) << r.output;
  // The refusal and the floor; the floor's plan is not listed as if it
  // were an answer for this budget.
  EXPECT_NE(r.output.find("feasible        NO: the budget is below the floor"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("recomputed:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--budget floor"), std::string::npos) << r.output;
  auto floor = Plan(profile_ + " --budget floor");
  EXPECT_EQ(floor.exit_code, 0) << floor.output;
  EXPECT_NE(floor.output.find("recomputed:"), std::string::npos)
      << floor.output;
}

// --swap=false plans recomputation only (what torch.compile's selective
// checkpointing can run); on a profile whose host link makes swapping
// worth it, the default plan swaps.
TEST_F(PlanCommandTest, SwapFalsePlansRecomputationOnly) {
  v1::Profile fast_link = planner::testing::DiamondProto();
  fast_link.mutable_device()->set_kind("cuda");
  fast_link.mutable_device()->set_host_to_device_bytes_per_second(1e15);
  fast_link.mutable_device()->set_device_to_host_bytes_per_second(1e15);
  const std::string path = dir_ + "/fast_link.json";
  ASSERT_TRUE(WriteFileAtomically(path, ProtoToJson(fast_link)).ok());
  auto floor = Plan(path + " --budget floor --output json");
  EXPECT_EQ(floor.exit_code, 0) << floor.output;
  EXPECT_GT(CountOf(floor.output, "\"action\": \"SWAP\""), 0) << floor.output;
  auto recompute = Plan(path + " --budget floor --swap=false --output json");
  EXPECT_EQ(recompute.exit_code, 0) << recompute.output;
  EXPECT_EQ(CountOf(recompute.output, "\"action\": \"SWAP\""), 0)
      << recompute.output;
  EXPECT_GT(CountOf(recompute.output, "\"action\": \"RECOMPUTE\""), 0)
      << recompute.output;
}

TEST_F(PlanCommandTest, BadInputExits2WithTheReason) {
  auto r = Plan(dir_ + "/missing.json --budget 60%");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing.json"), std::string::npos) << r.output;

  ASSERT_TRUE(WriteFileAtomically(dir_ + "/garbage.json", "{not json").ok());
  r = Plan(dir_ + "/garbage.json --budget 60%");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("garbage.json"), std::string::npos) << r.output;

  v1::Profile bad = planner::testing::DiamondProto();
  bad.mutable_activations(1)->set_first_backward_use(0);
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/bad.json", ProtoToJson(bad)).ok());
  r = Plan(dir_ + "/bad.json --budget 60%");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("activations[1] (value_id 101).first_backward_use"),
            std::string::npos)
      << r.output;

  EXPECT_EQ(Plan(profile_).exit_code, 2);                     // no budget
  EXPECT_EQ(Plan(profile_ + " --budget lots").exit_code, 2);  // bad budget
  EXPECT_EQ(Plan(profile_ + " --budget 60% --policy x").exit_code, 2);
}

// `--budget auto`: the knee of the Pareto curve, which always fits.
TEST_F(PlanCommandTest, AutoBudgetPlansAtTheKnee) {
  testing::CommandResult r = Plan(profile_ + " --budget auto --pareto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("budget          auto = "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("feasible        yes"), std::string::npos);
  EXPECT_NE(r.output.find("the knee of the Pareto curve"), std::string::npos);
}

// With the reserve (a profile of MiBs), the `auto` figure the budget line
// prints is the budget of the Pareto row marked as this schedule.
TEST_F(PlanCommandTest, AutoBudgetIsOnItsParetoRow) {
  std::mt19937 rng(1);
  const std::string path = dir_ + "/random.json";
  ASSERT_TRUE(
      WriteFileAtomically(path, ProtoToJson(planner::testing::ProfileProto(
                                    planner::testing::RandomProfile(rng, 40),
                                    int64_t{1} << 30)))
          .ok());
  auto r = RunCommand(BinPath("mutwo") + " plan " + path +
                      " --budget auto --pareto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch auto_line;
  ASSERT_TRUE(std::regex_search(r.output, auto_line,
                                std::regex("budget +auto = ([0-9.]+ [KMG]iB)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex("budget +" +
                           std::regex_replace(auto_line[1].str(),
                                              std::regex("\\."), "\\.") +
                           " -> .*<- this schedule \\(budget auto\\)\n")))
      << r.output;
}

// A profile JSON written before issue 13 (ProfileNode.occurrences 1,
// Activation.occurrence 0; both reserved since) plans as it did.
TEST_F(PlanCommandTest, ProfileWithRetiredOccurrenceFieldsPlansTheSame) {
  std::string old_json = ProtoToJson(planner::testing::DiamondProto());
  const int nodes = planner::testing::DiamondProto().nodes_size();
  const int activations = planner::testing::DiamondProto().activations_size();
  ASSERT_GT(nodes, 0);
  ASSERT_GT(activations, 0);
  old_json = absl::StrReplaceAll(
      old_json, {{"\"id\": ", "\"occurrences\": 1, \"id\": "},
                 {"\"value_id\": ", "\"occurrence\": 0, \"value_id\": "}});
  ASSERT_EQ(CountOf(old_json, "\"occurrences\": 1"), nodes);
  ASSERT_EQ(CountOf(old_json, "\"occurrence\": 0"), activations);
  const std::string old_profile = dir_ + "/old_profile.json";
  ASSERT_TRUE(WriteFileAtomically(old_profile, old_json).ok());

  const auto now = Plan(profile_ + " --budget 70% --output json");
  const auto old = Plan(old_profile + " --budget 70% --output json");
  ASSERT_EQ(now.exit_code, 0) << now.output;
  ASSERT_EQ(old.exit_code, 0) << old.output;
  EXPECT_EQ(old.output, now.output);
}

}  // namespace
}  // namespace mutwo

namespace mutwo {
namespace {

// A fresh directory holding chain profiles at batch sizes 2 and 4 (b2.json,
// b4.json): 4 MiB fixed + 8 activations of 1 MiB per sample.
std::string ChainProfilesDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + name + "_" + std::to_string(getpid());
  EXPECT_EQ(testing::RunCommand("mkdir -p " + dir).exit_code, 0);
  for (int batch : {2, 4}) {
    EXPECT_TRUE(
        WriteFileAtomically(dir + "/b" + std::to_string(batch) + ".json",
                            ProtoToJson(testing::ChainProfile(batch)))
            .ok());
  }
  return dir;
}

TEST(MaxBatchCommandTest, PredictsFromTwoProfilesAndNamesBadFiles) {
  const std::string dir = ChainProfilesDir("max_batch_command_test");
  const std::string bin = testing::BinPath("mutwo") + " max-batch ";
  // stdout only: the JSON (the warning for 8x goes to stderr).
  auto r = testing::RunCommand("(" + bin + dir + "/b2.json " + dir +
                               "/b4.json --capacity 100MiB --output json "
                               "2>/dev/null)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  v1::MaxBatchPrediction p;
  ASSERT_TRUE(ProtoFromJson(r.output, "max-batch", &p).ok()) << r.output;
  // Baseline peak = 4 MiB + 8 MiB x batch, against 100 MiB less the CPU
  // allocator reserve (16 KiB + 1.5% = 1.52 MiB): (98.48 - 4) / 8 = 11
  // samples fit (12 would leave no margin).
  EXPECT_EQ(p.reserve_bytes(), (16 << 10) + (int64_t{100} << 20) * 15 / 1000);
  EXPECT_EQ(p.max_batch_without_checkpointing(), 11);
  // 11 / 4: the answer says it extrapolated.
  EXPECT_GT(p.extrapolation(), 2);
  EXPECT_NE(p.reason().find("extrapolated"), std::string::npos) << p.reason();
  EXPECT_GE(p.max_batch_with_schedule(), p.max_batch_without_checkpointing());
  EXPECT_EQ(p.capacity_bytes(), 100 << 20);

  auto one = testing::RunCommand(bin + dir + "/b2.json");
  EXPECT_EQ(one.exit_code, 2) << one.output;
  auto missing =
      testing::RunCommand(bin + dir + "/b2.json " + dir + "/nope.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("nope.json"), std::string::npos)
      << missing.output;
  testing::RunCommand("rm -rf " + dir);
}

// Far beyond the profiled batch sizes (a capacity defaulted from the
// profiled device: here 24 GiB for profiles at 2 and 4), the answer comes
// with a warning that says the factor and what to do; close to them, none.
TEST(MaxBatchCommandTest, WarnsWhenItExtrapolatesFarBeyondTheProfiles) {
  const std::string dir = ChainProfilesDir("max_batch_far_test");
  const std::string profiles = testing::BinPath("mutwo") + " max-batch " + dir +
                               "/b2.json " + dir + "/b4.json";
  auto far = testing::RunCommand(profiles);
  ASSERT_EQ(far.exit_code, 0) << far.output;
  EXPECT_THAT(far.output,
              ::testing::ContainsRegex(
                  "warning: the answer \\([0-9]+\\) is [0-9]{3,}\\.[0-9]x "
                  "the largest profiled batch size \\(4\\)"));
  // The warning and the answer's line say the same factor (it said 17x
  // above "extrapolated 16.8x").
  const std::regex warned("is ([0-9.]+)x the largest");
  const std::regex stated("extrapolated ([0-9.]+)x beyond");
  std::smatch w, s;
  ASSERT_TRUE(std::regex_search(far.output, w, warned)) << far.output;
  ASSERT_TRUE(std::regex_search(far.output, s, stated)) << far.output;
  EXPECT_EQ(w[1].str(), s[1].str()) << far.output;
  EXPECT_THAT(far.output, ::testing::HasSubstr("give --capacity"));
  auto given = testing::RunCommand(profiles + " --capacity 1GiB");
  EXPECT_THAT(given.output, ::testing::HasSubstr("warning: the answer"));
  EXPECT_THAT(given.output,
              ::testing::Not(::testing::HasSubstr("give --capacity")));
  // (30 MiB - reserve - 4 MiB) / 8 MiB = 3 samples: within the profiles.
  auto near = testing::RunCommand(profiles + " --capacity 30MiB");
  ASSERT_EQ(near.exit_code, 0) << near.output;
  EXPECT_THAT(near.output, ::testing::Not(::testing::HasSubstr("warning")));
  testing::RunCommand("rm -rf " + dir);
}

// A schedule for a batch size too large to profile without one: planned on
// the profile fitted from two smaller batch sizes.
TEST(PlanAtBatchCommandTest, PlansAnExtrapolatedBatchSize) {
  const std::string dir = ChainProfilesDir("plan_at_batch_test");
  const std::string plan = testing::BinPath("mutwo") + " plan " + dir +
                           "/b2.json " + dir + "/b4.json ";
  // Batch 20: baseline 4 MiB + 8 x 20 MiB = 164 MiB; a 100 MiB budget needs
  // recomputation.
  auto r =
      testing::RunCommand(plan + "--batch 20 --budget 100MiB --output json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  v1::Schedule s;
  ASSERT_TRUE(ProtoFromJson(r.output, "plan", &s).ok()) << r.output;
  EXPECT_EQ(s.batch_size(), 20);
  EXPECT_TRUE(s.feasible());
  EXPECT_GT(s.baseline_peak_bytes(), int64_t{150} << 20);
  EXPECT_LE(s.predicted_peak_bytes(), int64_t{100} << 20);
  EXPECT_GT(s.recomputed() + s.swapped(), 0);
  EXPECT_NE(s.reason().find("extrapolated to batch size 20"), std::string::npos)
      << s.reason();

  auto one = testing::RunCommand(testing::BinPath("mutwo") + " plan " + dir +
                                 "/b2.json --batch 20 --budget 100MiB");
  EXPECT_EQ(one.exit_code, 2) << one.output;
  EXPECT_NE(one.output.find("two or more"), std::string::npos) << one.output;
  auto bad = testing::RunCommand(plan + "--batch x --budget 100MiB");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--batch \"x\""), std::string::npos) << bad.output;
  testing::RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace mutwo
