// MUTWO_DCHECK as a debug build has it (turned on here whatever the build
// type): a failure aborts naming the condition and the message; a check
// that holds costs nothing of its message.
#define MUTWO_DCHECK_ALWAYS_ON
#include "common/dcheck.h"

#include <gtest/gtest.h>

namespace mutwo {
namespace {

TEST(DcheckTest, AFailedCheckAbortsWithTheConditionAndTheMessage) {
  const int peak_bytes = -5;
  EXPECT_DEATH(MUTWO_DCHECK(peak_bytes >= 0) << "simulated peak " << peak_bytes,
               "MUTWO_DCHECK\\(peak_bytes >= 0\\) failed: simulated peak -5");
}

TEST(DcheckTest, AHoldingCheckDoesNotEvaluateItsMessage) {
  int evaluated = 0;
  MUTWO_DCHECK(1 + 1 == 2) << ++evaluated;
  EXPECT_EQ(evaluated, 0);
}

}  // namespace
}  // namespace mutwo
