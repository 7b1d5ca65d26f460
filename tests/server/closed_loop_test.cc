// The closed loop's rules on hand-made schedules and validations.
#include "server/closed_loop.h"

#include "common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;
using Next = RoundDecision::Next;

v1::Schedule Planned(int64_t budget, int64_t predicted, int64_t correction) {
  v1::Schedule s;
  *s.mutable_budget() = *ParseBudget("60%");
  s.set_budget_bytes(budget);
  s.set_feasible(true);
  s.set_predicted_peak_bytes(predicted);
  s.set_floor_bytes(budget / 2);
  s.set_correction_bytes(correction);
  return s;
}

v1::Validation Measured(const v1::Schedule& s, int64_t peak) {
  v1::Validation v;
  v.set_budget_bytes(s.budget_bytes());
  v.mutable_scheduled()->set_peak_bytes(peak);
  v.set_within_budget(peak <= s.budget_bytes());
  v.set_gradients_match(true);
  v.set_batchnorm_stats_match(true);
  return v;
}

TEST(ClosedLoopTest, WithinTheBudgetFits) {
  const v1::Schedule s = Planned(100000, 90000, 0);
  const RoundDecision d = JudgeRound(s, Measured(s, 100000), 1, {});
  EXPECT_EQ(d.next, Next::kFits);
  EXPECT_EQ(d.metric_result, "fits");
}

TEST(ClosedLoopTest, OvershootIsCorrectedByItsErrorPlusTheMargin) {
  const v1::Schedule s = Planned(100000, 90000, 0);
  const RoundDecision d = JudgeRound(s, Measured(s, 104000), 1, {});
  EXPECT_EQ(d.next, Next::kReplan);
  EXPECT_EQ(d.metric_result, "over_budget");
  // measured - predicted = 14000, plus 1% of the budget.
  EXPECT_EQ(d.correction_bytes, 14000 + 1000);
  // A repeat of the same error then lands 1% under the budget.
  EXPECT_LE(100000 - d.correction_bytes + 14000, 99000);
}

TEST(ClosedLoopTest, CorrectionGrowsEveryRoundItStillOvershoots) {
  // Planned well below the budget already, still over by one byte.
  const v1::Schedule s = Planned(100000, 50000, 60000);
  const RoundDecision d = JudgeRound(s, Measured(s, 100001), 2, {});
  EXPECT_EQ(d.next, Next::kReplan);
  EXPECT_GE(d.correction_bytes, 60000 + 1000);
}

TEST(ClosedLoopTest, LastRoundOverTheBudgetDoesNotFit) {
  const v1::Schedule s = Planned(100000, 90000, 0);
  ClosedLoopOptions options;
  options.max_rounds = 2;
  const RoundDecision d = JudgeRound(s, Measured(s, 104000), 2, options);
  EXPECT_EQ(d.next, Next::kOverBudget);
  EXPECT_EQ(d.reason,
            "measured 101.56 KiB > budget 97.66 KiB after 2 rounds; floor "
            "48.83 KiB");
  options.max_rounds = 1;
  EXPECT_THAT(JudgeRound(s, Measured(s, 104000), 1, options).reason,
              HasSubstr("after 1 round;"));
}

// The budget `floor` is never planned lower: over its prediction, the
// measured peak becomes the floor and the schedule fits it.
TEST(ClosedLoopTest, AFloorMeasuredOverItsPredictionIsTheMeasuredFloor) {
  v1::Schedule s = Planned(100000, 99000, 0);
  *s.mutable_budget() = *ParseBudget("floor");
  s.set_floor_bytes(100000);
  const RoundDecision d = JudgeRound(s, Measured(s, 103000), 1, {});
  EXPECT_EQ(d.next, Next::kFloorMeasured);
  EXPECT_EQ(d.metric_result, "over_budget");
  EXPECT_EQ(d.reason,
            "the floor measured 100.59 KiB (predicted 97.66 KiB, +3.0%); "
            "100.84 KiB with a 0.25% margin for the peak's run-to-run jitter "
            "is the lowest budget this schedule is proved to fit");
  // The budget another process's run of the floor is held to: the peak
  // plus 0.25% (258 B here), not the peak itself.
  EXPECT_EQ(MeasuredFloorBytes(103000), 103258);
  const v1::Schedule marked = MarkMeasured(s, 103000, d.reason);
  EXPECT_TRUE(marked.feasible());
  EXPECT_EQ(marked.budget_bytes(), 103258);
  EXPECT_EQ(marked.floor_bytes(), 103258);
  EXPECT_EQ(marked.measured_peak_bytes(), 103000);
  // Within the prediction it simply fits; wrong gradients still fail.
  EXPECT_EQ(JudgeRound(s, Measured(s, 99000), 1, {}).next, Next::kFits);
  v1::Validation wrong = Measured(s, 103000);
  wrong.set_gradients_match(false);
  EXPECT_EQ(JudgeRound(s, wrong, 1, {}).next, Next::kFailed);
  // Any other budget over its prediction is still re-planned, and a
  // schedule for it measured over is not feasible.
  const v1::Schedule other = Planned(100000, 99000, 0);
  EXPECT_EQ(JudgeRound(other, Measured(other, 103000), 1, {}).next,
            Next::kReplan);
  EXPECT_FALSE(MarkMeasured(other, 103000, "over").feasible());
}

TEST(ClosedLoopTest, OutOfMemoryAndWrongGradientsFailWithoutReplanning) {
  const v1::Schedule s = Planned(100000, 90000, 0);
  v1::Validation oom = Measured(s, 0);
  oom.set_oom(true);
  oom.set_error("CUDA out of memory");
  RoundDecision d = JudgeRound(s, oom, 1, {});
  EXPECT_EQ(d.next, Next::kFailed);
  EXPECT_EQ(d.metric_result, "failed");
  EXPECT_EQ(d.reason, "out of memory: CUDA out of memory (round 1)");
  v1::Validation wrong = Measured(s, 120000);
  wrong.set_gradients_match(false);
  d = JudgeRound(s, wrong, 1, {});
  EXPECT_EQ(d.next, Next::kFailed);
  EXPECT_THAT(d.reason, HasSubstr("exceeds the budget"));
  EXPECT_THAT(d.reason, HasSubstr("gradients"));
}

TEST(ClosedLoopTest, PlannedOutcomes) {
  v1::Schedule s = Planned(100000, 90000, 0);
  EXPECT_EQ(PlannedOutcome(s).state(), v1::BudgetOutcome::VALIDATING);
  EXPECT_FALSE(PlannedOutcome(s).fits());
  s.set_feasible(false);
  EXPECT_EQ(PlannedOutcome(s).state(), v1::BudgetOutcome::INFEASIBLE);
  // The job's outcome gives the planner's reason, as `mutwo plan` does.
  s.set_reason(
      "the budget 97.66 KiB is below the floor 120.00 KiB, the lowest peak "
      "the mu-TWO policy reaches; baseline peak 200.00 KiB");
  EXPECT_EQ(PlannedOutcome(s).reason(), s.reason() + "; nothing run");
  s.clear_reason();
  EXPECT_THAT(PlannedOutcome(s).reason(), HasSubstr("is below the floor"));
  const v1::Schedule over = MarkMeasured(Planned(100000, 90000, 0), 100001,
                                         "measured over after 3 rounds");
  EXPECT_FALSE(over.feasible());
  EXPECT_THAT(over.reason(), HasSubstr("after 3 rounds"));
  const v1::BudgetOutcome o = PlannedOutcome(over);
  EXPECT_EQ(o.state(), v1::BudgetOutcome::OVER_BUDGET);
  EXPECT_EQ(o.measured_peak_bytes(), 100001);
  EXPECT_THAT(o.reason(), HasSubstr("after 3 rounds"));
  const v1::Schedule fits = MarkMeasured(Planned(100000, 90000, 0), 95000, "");
  EXPECT_TRUE(fits.feasible());
  EXPECT_EQ(fits.measured_peak_bytes(), 95000);
}

TEST(ClosedLoopTest, SamePlanIgnoresCurvesAndMeasurementsOnly) {
  v1::Schedule a = Planned(100000, 90000, 0);
  v1::Schedule b = a;
  b.add_pareto()->set_budget_bytes(5);
  b.add_timeline()->set_position(3);
  b.set_measured_peak_bytes(95000);
  EXPECT_TRUE(SamePlan(a, b));
  b.set_correction_bytes(1);
  EXPECT_FALSE(SamePlan(a, b));
  EXPECT_FALSE(SamePlan(a, MarkMeasured(a, 100001, "over")));
}

}  // namespace
}  // namespace mutwo
