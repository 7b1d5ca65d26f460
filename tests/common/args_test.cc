#include "common/args.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
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
  EXPECT_THAT(usage, ::testing::ContainsRegex("--args_test_count +a test flag "
                                              "\\(default: 1\\)"));
  EXPECT_THAT(usage, ::testing::Not(HasSubstr("--flagfile")));
  EXPECT_THAT(usage, HasSubstr("--version"));
}

TEST(ParseArgs, VersionAndGivenFlagsAreReported) {
  auto args = Parse({"prog", "--version", "--args_test_count=2",
                     "--args_test_input", "a", "--args_test_input=b"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->version);
  EXPECT_THAT(args->flags, ElementsAre("args_test_count", "args_test_input",
                                       "args_test_input"));
  EXPECT_TRUE(args->Given("args_test_count"));
  EXPECT_FALSE(args->Given("args_test_verbose"));
}

TEST(ParseArgs, OneLetterFlagsOnlyAsDeclaredShortNames) {
  std::vector<std::string> words = {"prog", "-c", "7"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  auto args = ParseArgs(3, argv.data(), 1, {}, {{"c", "args_test_count"}});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_args_test_count), 7);
  EXPECT_THAT(args->flags, ElementsAre("args_test_count"));
  // Without the declaration `-c` is unknown, and `--c` never works.
  EXPECT_EQ(Parse({"prog", "-c", "7"}).status().message(),
            "unknown flag \"-c\"; see --help");
  EXPECT_EQ(ParseArgs(3, argv.data(), 1, {}).status().message(),
            "unknown flag \"-c\"; see --help");
}

TEST(FlagLines, DefaultsOnceAndWrappedAt80Columns) {
  const std::string lines = FlagLines(
      {"args_test_count", "args_test_verbose", "args_test_input"},
      {{"args_test_input",
        "a long help text that names its own default (default: nothing) and "
        "goes on well past the eightieth column of a terminal"}},
      {}, false);
  // Bool false and empty defaults are not printed; a help that names its
  // default gets no second one.
  EXPECT_THAT(lines, HasSubstr("a test bool flag\n"));
  EXPECT_THAT(lines, ::testing::Not(HasSubstr("(default: false)")));
  EXPECT_THAT(lines, ::testing::Not(HasSubstr("(default: \"\")")));
  const size_t input = lines.find("--args_test_input");
  ASSERT_NE(input, std::string::npos);
  const size_t own = lines.find("(default:", input);
  EXPECT_NE(own, std::string::npos) << lines;
  EXPECT_EQ(lines.find("(default", own + 1), std::string::npos) << lines;
  for (absl::string_view line : absl::StrSplit(lines, '\n')) {
    EXPECT_LE(line.size(), 80u) << line;
  }
}

}  // namespace
}  // namespace mutwo
