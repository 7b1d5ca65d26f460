// The floor column of `mutwo job` (client/floor_text.h).
#include "client/floor_text.h"

#include "gtest/gtest.h"

namespace mutwo {
namespace {

v1::BatchResult Result(int64_t floor) {
  v1::BatchResult r;
  r.set_floor_bytes(floor);
  return r;
}

TEST(FloorText, PredictedUntilAWorkerMeasuredIt) {
  v1::BatchResult r = Result(3 << 20);
  EXPECT_EQ(FloorText(r), "3.00 MiB predicted");
  r.set_measured_floor_bytes((3 << 20) + (512 << 10));
  EXPECT_EQ(FloorText(r), "3.50 MiB measured");
}

// A budget at or above the predicted floor that a worker measured over
// (after the closed loop's rounds) is never shown as the floor.
TEST(FloorText, ABudgetMeasuredOverIsNotShownAsTheFloor) {
  v1::BatchResult r = Result(3 << 20);
  v1::BudgetOutcome& below = *r.add_outcomes();
  below.set_state(v1::BudgetOutcome::OVER_BUDGET);
  below.set_budget_bytes(2 << 20);  // below the floor: says nothing new
  EXPECT_EQ(FloorText(r), "3.00 MiB predicted");
  v1::BudgetOutcome& at = *r.add_outcomes();
  at.set_state(v1::BudgetOutcome::OVER_BUDGET);
  at.set_budget_bytes(3 << 20);
  v1::BudgetOutcome& fits = *r.add_outcomes();
  fits.set_state(v1::BudgetOutcome::FITS);
  fits.set_budget_bytes(5 << 20);
  EXPECT_EQ(FloorText(r), "> 3.00 MiB measured");
  at.set_budget_bytes(4 << 20);
  EXPECT_EQ(FloorText(r), "> 4.00 MiB measured");
}

}  // namespace
}  // namespace mutwo
