// Bounded planning (issue 15): a crafted, valid profile with dense recompute
// lineages (tests/testing/adversarial_profile.h) plans within the time
// allowed or is refused with DeadlineExceeded; a cancelled caller stops the
// planner within a poll; an interrupt that never fires changes nothing.
#include <atomic>
#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/interrupt.h"
#include "planner/plan_request.h"
#include "planner/proto_convert.h"
#include "tests/testing/adversarial_profile.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo::planner {
namespace {

using ::testing::HasSubstr;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

ScheduleRequest HalfOfBaseline() {
  ScheduleRequest r;
  r.budget.set_fraction_of_baseline(0.5);
  r.pareto_points = 20;
  return r;
}

TEST(BoundedPlanningTest, DenseFourThousandActivationProfileIsValid) {
  EXPECT_TRUE(ValidateProfile(testing::DenseRecomputeProfile(4096, 32)).ok());
}

// Every activation rebuilt from every earlier one: 62 s to plan at 4k
// without the limit; refused at once, naming the field.
TEST(BoundedPlanningTest, FullyDenseLineagesAreRefusedAtOnce) {
  const v1::Profile profile = testing::DenseRecomputeProfile(4096, 4096);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status valid = ValidateProfile(profile);
  auto schedule = PlanSchedule(profile, HalfOfBaseline());
  EXPECT_LE(SecondsSince(start), 1.0);
  EXPECT_TRUE(absl::IsInvalidArgument(valid)) << valid;
  EXPECT_THAT(valid.message(), HasSubstr("recompute_sources (total)"));
  EXPECT_TRUE(absl::IsInvalidArgument(schedule.status()));
}

TEST(BoundedPlanningTest, DenseProfilePlansWithinOneSecondOrIsRefused) {
  for (int activations : {1024, 4096}) {
    SCOPED_TRACE(activations);
    // The densest lineages ValidateProfile lets through.
    const v1::Profile profile =
        testing::DenseRecomputeProfile(activations, kMaxMeanRecomputeSources);
    Interrupt interrupt(absl::Now() + absl::Seconds(1), nullptr);
    ScheduleRequest request = HalfOfBaseline();
    request.interrupt = &interrupt;
    const auto start = std::chrono::steady_clock::now();
    auto schedule = PlanSchedule(profile, request);
    const double seconds = SecondsSince(start);
    std::cout << activations << " activations: " << seconds << " s, "
              << (schedule.ok() ? "planned" : schedule.status().ToString())
              << "\n";
    // The deadline is polled per step: a little slack over the second.
    EXPECT_LE(seconds, 1.25);
    if (!schedule.ok()) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(schedule.status()))
          << schedule.status();
      EXPECT_THAT(schedule.status().message(), HasSubstr("--max_plan_ms"));
    }
  }
}

TEST(BoundedPlanningTest, CancelledCallerStopsThePlannerWithinAPoll) {
  const v1::Profile profile =
      testing::DenseRecomputeProfile(4096, kMaxMeanRecomputeSources);
  std::atomic<bool> gone{false};
  Interrupt interrupt(absl::InfiniteFuture(), [&] { return gone.load(); });
  ScheduleRequest request = HalfOfBaseline();
  request.interrupt = &interrupt;
  std::thread leave([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gone = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto schedule = PlanSchedule(profile, request);
  const double seconds = SecondsSince(start);
  leave.join();
  if (schedule.ok()) {
    // Finished before the caller left: then it must have been quick.
    EXPECT_LE(seconds, 0.3);
  } else {
    EXPECT_TRUE(absl::IsCancelled(schedule.status())) << schedule.status();
    EXPECT_LE(seconds, 0.2 + 0.5) << "CPU used well after the caller left";
  }
}

TEST(BoundedPlanningTest, AnInterruptThatNeverFiresChangesNothing) {
  const v1::Profile profile = testing::ChainProfile(4);
  Interrupt never;
  ScheduleRequest with = HalfOfBaseline();
  with.interrupt = &never;
  auto a = PlanSchedule(profile, HalfOfBaseline());
  auto b = PlanSchedule(profile, with);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
}

}  // namespace
}  // namespace mutwo::planner
