// Every binary prints its usage for --help and exits 0, and refuses unknown
// commands and flags with exit code 2 and a line naming them.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"

namespace {

using ::testing::HasSubstr;

using mutwo::testing::BinPath;
using mutwo::testing::CommandResult;
using mutwo::testing::RunCommand;

class BinaryHelp : public ::testing::TestWithParam<const char*> {};

TEST_P(BinaryHelp, HelpExitsZeroWithUsage) {
  CommandResult r = RunCommand(BinPath(GetParam()) + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Usage: " + std::string(GetParam())));
}

TEST_P(BinaryHelp, UnknownFlagExitsTwo) {
  CommandResult r = RunCommand(BinPath(GetParam()) + " --no_such_flag=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("unknown flag \"--no_such_flag\""));
}

INSTANTIATE_TEST_SUITE_P(All, BinaryHelp,
                         ::testing::Values("mutwo", "mutwo-server",
                                           "mutwo-worker"));

TEST(Binaries, UnknownCommandExitsTwo) {
  CommandResult r = RunCommand(BinPath("mutwo") + " frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown command \"frobnicate\""));
}

TEST(Binaries, HealthAgainstNothingIsUnavailable) {
  // Port 1 on loopback: nothing listens there.
  CommandResult r = RunCommand(
      BinPath("mutwo") + " health --server=127.0.0.1:1 --timeout_ms=2000");
  EXPECT_EQ(r.exit_code, 4) << r.output;
}

}  // namespace
