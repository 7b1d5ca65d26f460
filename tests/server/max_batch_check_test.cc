// Verifying a predicted max batch size: when it is run, and how a step
// over the capacity or out of memory steps the batch size down.
#include "server/max_batch_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

v1::Validation Measured(int64_t peak_bytes, bool oom = false) {
  v1::Validation v;
  v.mutable_scheduled()->set_peak_bytes(peak_bytes);
  v.set_oom(oom);
  v.set_baseline_skipped(true);
  return v;
}

TEST(MaxBatchCheckTest, RunsOnCudaOrWithACapacityOnly) {
  v1::JobSpec spec;
  v1::DeviceInfo cpu, cuda;
  cpu.set_kind("cpu");
  cuda.set_kind("cuda");
  EXPECT_EQ(WhyNotVerified(spec, cuda), "");
  EXPECT_THAT(WhyNotVerified(spec, cpu), HasSubstr("--capacity"));
  spec.mutable_capacity()->set_bytes(1 << 30);
  EXPECT_EQ(WhyNotVerified(spec, cpu), "");
}

TEST(MaxBatchCheckTest, WithinTheCapacityIsVerified) {
  const MaxBatchStep step =
      JudgeMaxBatchStep(QueuedCheck(100, 1000), Measured(990), {});
  EXPECT_EQ(step.next, MaxBatchStep::Next::kVerified);
  EXPECT_EQ(step.check.state(), v1::MaxBatchCheck::VERIFIED);
  EXPECT_EQ(step.check.batch_size(), 100);
  EXPECT_EQ(step.check.measured_peak_bytes(), 990);
  EXPECT_EQ(step.check.rounds(), 1);
}

TEST(MaxBatchCheckTest, OverTheCapacityStepsDownByWhatItMeasured) {
  MaxBatchStep step =
      JudgeMaxBatchStep(QueuedCheck(100, 1000), Measured(1250), {});
  ASSERT_EQ(step.next, MaxBatchStep::Next::kStepDown);
  // 100 x 1000 / 1250 = 80, 2% under.
  EXPECT_EQ(step.next_batch, 78);
  EXPECT_EQ(step.check.state(), v1::MaxBatchCheck::VERIFYING);
  EXPECT_EQ(step.check.batch_size(), 78);
  EXPECT_EQ(step.check.predicted_batch_size(), 100);
  EXPECT_THAT(step.check.reason(), HasSubstr("stepped down to 78"));
  // The next step fits: verified at the smaller batch, saying so.
  step = JudgeMaxBatchStep(step.check, Measured(980), {});
  EXPECT_EQ(step.next, MaxBatchStep::Next::kVerified);
  EXPECT_EQ(step.check.batch_size(), 78);
  EXPECT_EQ(step.check.rounds(), 2);
  EXPECT_THAT(step.check.reason(),
              HasSubstr("stepped down from the prediction 100"));
}

TEST(MaxBatchCheckTest, OutOfMemoryStepsDownAQuarterAndRoundsEnd) {
  MaxBatchStep step =
      JudgeMaxBatchStep(QueuedCheck(100, 1000), Measured(0, true), {});
  ASSERT_EQ(step.next, MaxBatchStep::Next::kStepDown);
  EXPECT_EQ(step.next_batch, 75);
  step = JudgeMaxBatchStep(step.check, Measured(0, true), {});
  ASSERT_EQ(step.next, MaxBatchStep::Next::kStepDown);
  step = JudgeMaxBatchStep(step.check, Measured(2000), {});
  EXPECT_EQ(step.next, MaxBatchStep::Next::kFailed);
  EXPECT_EQ(step.check.state(), v1::MaxBatchCheck::FAILED);
  EXPECT_THAT(step.check.reason(), HasSubstr("after 3 steps"));
  // A step that failed otherwise is not stepped down.
  v1::Validation broken = Measured(10);
  broken.set_error("input x: expected 4 dims");
  step = JudgeMaxBatchStep(QueuedCheck(8, 1000), broken, {});
  EXPECT_EQ(step.next, MaxBatchStep::Next::kFailed);
  EXPECT_THAT(step.check.reason(), HasSubstr("expected 4 dims"));
}

}  // namespace
}  // namespace mutwo
