// The time columns of `mutwo jobs` (client/time_text.h).
#include "client/time_text.h"

#include "gtest/gtest.h"

namespace mutwo {
namespace {

constexpr int64_t kAt = 1795803723000;  // 2026-11-27 18:22:03 UTC

TEST(TimeText, SubmittedIsADateAndMinuteInTheGivenZone) {
  EXPECT_EQ(DateTimeText(kAt, absl::UTCTimeZone()), "2026-11-27 18:22");
  EXPECT_EQ(DateTimeText(kAt, absl::FixedTimeZone(3600)), "2026-11-27 19:22");
  EXPECT_EQ(DateTimeText(0, absl::UTCTimeZone()), "-");
}

TEST(TimeText, UpdatedIsAnAgeInTheLargestUnitThatReadsAtAGlance) {
  EXPECT_EQ(AgoText(kAt, kAt + 400), "just now");
  EXPECT_EQ(AgoText(kAt, kAt - 5000), "just now");  // a clock ahead
  EXPECT_EQ(AgoText(kAt, kAt + 12'000), "12s ago");
  EXPECT_EQ(AgoText(kAt, kAt + 5 * 60'000 + 59'000), "5m ago");
  EXPECT_EQ(AgoText(kAt, kAt + 2 * 3'600'000 + 5 * 60'000), "2h05m ago");
  EXPECT_EQ(AgoText(kAt, kAt + 3 * 86'400'000 + 1000), "3d ago");
  EXPECT_EQ(AgoText(0, kAt), "-");
}

}  // namespace
}  // namespace mutwo
