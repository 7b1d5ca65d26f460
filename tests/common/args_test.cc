#include "common/args.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int32_t, args_test_count, 1, "a test flag");
ABSL_FLAG(bool, args_test_verbose, false, "a test bool flag");
ABSL_FLAG(std::string, args_test_input, "", "a repeated test flag");

namespace mutwo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<ParsedArgs> Parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return ParseArgs(static_cast<int>(argv.size()), argv.data(), 1,
                   {"args_test_input"});
}

TEST(ParseArgs, FlagsPositionalsAndRepeats) {
  auto args = Parse({"prog", "profile", "model.pt", "--args_test_count=5",
                     "--args_test_input", "x:float32[B]",
                     "--args_test_input=y:float32[B]", "--args_test_verbose"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->positional, ElementsAre("profile", "model.pt"));
  EXPECT_THAT(args->Repeated("args_test_input"),
              ElementsAre("x:float32[B]", "y:float32[B]"));
  EXPECT_EQ(absl::GetFlag(FLAGS_args_test_count), 5);
  EXPECT_TRUE(absl::GetFlag(FLAGS_args_test_verbose));
  ASSERT_TRUE(Parse({"prog", "--noargs_test_verbose"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_args_test_verbose));
}

TEST(ParseArgs, ErrorsNameTheFlag) {
  EXPECT_EQ(Parse({"prog", "--bogus=1"}).status().message(),
            "unknown flag \"--bogus\"; see --help");
  EXPECT_THAT(
      std::string(Parse({"prog", "--args_test_count=many"}).status().message()),
      HasSubstr("flag \"--args_test_count\": bad value \"many\""));
  EXPECT_EQ(Parse({"prog", "--args_test_count"}).status().message(),
            "flag \"--args_test_count\" needs a value");
}

TEST(ParseArgs, HelpAndUsageListProjectFlags) {
  auto args = Parse({"prog", "--help"});
  ASSERT_TRUE(args.ok());
  EXPECT_TRUE(args->help);
  const std::string usage = UsageWithFlags("Usage: prog");
  EXPECT_THAT(usage, HasSubstr("--args_test_count  a test flag"));
  EXPECT_THAT(usage, ::testing::Not(HasSubstr("--flagfile")));
}

}  // namespace
}  // namespace mutwo
