#include "common/validation_check.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

v1::Validation Good() {
  v1::Validation v;
  v.set_budget_bytes(1000);
  v.mutable_scheduled()->set_peak_bytes(1000);
  v.set_within_budget(true);
  v.set_gradients_match(true);
  v.set_batchnorm_stats_match(true);
  return v;
}

TEST(ValidationCheckTest, AtTheBudgetAndMatchingProvesTheSchedule) {
  const ValidationCheck c = CheckValidation(Good());
  EXPECT_TRUE(c.ok()) << c.problem;
  EXPECT_TRUE(c.within_budget);
  EXPECT_TRUE(c.matches_baseline);
}

TEST(ValidationCheckTest, OneByteOverTheBudgetIsOverBudget) {
  v1::Validation v = Good();
  v.mutable_scheduled()->set_peak_bytes(1001);
  // The worker's own flag is not trusted over the numbers.
  v.set_within_budget(true);
  const ValidationCheck c = CheckValidation(v);
  EXPECT_FALSE(c.ok());
  EXPECT_FALSE(c.within_budget);
  EXPECT_TRUE(c.matches_baseline);
  EXPECT_EQ(c.problem,
            "measured peak 1001 B exceeds the budget 1000 B by 0.1%");
}

TEST(ValidationCheckTest, GradientsLossAndBatchNormAreEachJudged) {
  v1::Validation v = Good();
  v.set_gradients_match(false);
  v.set_max_abs_grad_diff(0.5);
  EXPECT_EQ(CheckValidation(v).problem,
            "gradients (max |diff| 0.5) differ from the unmodified step");
  v.set_worst_gradient_parameter("layer3.4.conv2.weight");
  EXPECT_EQ(CheckValidation(v).problem,
            "gradients (max |diff| 0.5, worst at layer3.4.conv2.weight) "
            "differ from the unmodified step");
  v = Good();
  v.set_loss_diff(NAN);
  EXPECT_THAT(CheckValidation(v).problem, HasSubstr("loss (diff nan)"));
  v = Good();
  v.set_loss_diff(kMaxLossDiff);
  EXPECT_TRUE(CheckValidation(v).ok());
  v = Good();
  v.set_batchnorm_stats_match(false);
  v.mutable_scheduled()->set_peak_bytes(2000);
  const ValidationCheck both = CheckValidation(v);
  EXPECT_FALSE(both.within_budget);
  EXPECT_FALSE(both.matches_baseline);
  EXPECT_EQ(both.problem,
            "measured peak 1.95 KiB exceeds the budget 1000 B by 100.0%; "
            "batch-norm statistics differ from the unmodified step");
}

TEST(ValidationCheckTest, SkippedBaselineJudgesOnlyTheBudget) {
  v1::Validation v = Good();
  v.set_baseline_skipped(true);
  v.set_gradients_match(false);
  v.set_batchnorm_stats_match(false);
  EXPECT_TRUE(CheckValidation(v).ok());
}

TEST(ValidationCheckTest, OutOfMemoryIsAFailure) {
  v1::Validation v;
  v.set_budget_bytes(1000);
  v.set_oom(true);
  v.set_error("CPU allocator: 4096 B over the limit");
  const ValidationCheck c = CheckValidation(v);
  EXPECT_TRUE(c.out_of_memory);
  EXPECT_FALSE(c.within_budget);
  EXPECT_EQ(c.problem, "out of memory: CPU allocator: 4096 B over the limit");
}

}  // namespace
}  // namespace mutwo
