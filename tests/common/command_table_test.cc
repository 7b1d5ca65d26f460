// The command table: per-command help, refused flags, dispatch, --version
// and the check of the table against the flags linked in.
#include "common/command_table.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, table_test_color, "red", "the color");
ABSL_FLAG(bool, table_test_loud, false, "shout");
ABSL_FLAG(std::string, table_test_item, "", "an item, repeatable");
ABSL_FLAG(std::string, table_test_format, "text", "text or json");

namespace mutwo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Outcome {
  int exit_code;
  std::string out, err;
};

class CommandTableTest : public ::testing::Test {
 protected:
  CommandTableTest() {
    options_.program = "prog";
    options_.description = "prog: does things.";
    options_.footer = "Exit codes: 0 ok, 2 bad input.";
    options_.global_flags = {"table_test_format"};
    options_.parse.repeated = {"table_test_item"};
    options_.parse.short_names = {{"c", "table_test_color"}};
    commands_ = {
        {"paint",
         "THING [--table_test_color C]",
         "paint a thing",
         "Paints it.",
         {"table_test_color", "args_test_count"},
         {{"args_test_count", "coats of paint"}},
         [this](const ParsedArgs& a) {
           ran_ = "paint";
           positional_ = a.positional;
           return 0;
         }},
        {"shout",
         "",
         "shout about it",
         "",
         // Flags of the other test files linked in must be taken by some
         // command, or Validate fails.
         {"table_test_loud", "table_test_item", "args_test_verbose",
          "args_test_input"},
         {},
         [this](const ParsedArgs&) {
           ran_ = "shout";
           return 5;
         }},
    };
  }

  Outcome Run(std::vector<std::string> words) {
    words.insert(words.begin(), "prog");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    const CommandTable table(options_, commands_);
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    const int code = table.Run(static_cast<int>(argv.size()), argv.data());
    std::string out = ::testing::internal::GetCapturedStdout();
    std::string err = ::testing::internal::GetCapturedStderr();
    return {code, out, err};
  }

  CommandTableOptions options_;
  std::vector<CommandSpec> commands_;
  std::string ran_;
  std::vector<std::string> positional_;
};

TEST_F(CommandTableTest, DispatchesWithPositionalsAfterTheCommand) {
  const Outcome o = Run({"paint", "wall", "-c", "blue"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(ran_, "paint");
  EXPECT_THAT(positional_, ::testing::ElementsAre("wall"));
  EXPECT_EQ(absl::GetFlag(FLAGS_table_test_color), "blue");
  EXPECT_EQ(Run({"shout"}).exit_code, 5);
}

TEST_F(CommandTableTest, AFlagOfAnotherCommandIsRefusedNamingBoth) {
  const Outcome o = Run({"paint", "wall", "--table_test_loud"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(ran_, "");  // nothing ran
  EXPECT_EQ(o.err,
            "prog paint: --table_test_loud does not apply to \"paint\"; prog "
            "paint --help lists its flags\n");
  // A repeated flag is checked like any other; a global flag is taken by all.
  EXPECT_EQ(Run({"paint", "--table_test_item", "x"}).exit_code, 2);
  EXPECT_EQ(Run({"shout", "--table_test_format", "json"}).exit_code, 5);
}

TEST_F(CommandTableTest, CommandHelpListsOnlyItsFlags) {
  for (const auto& words :
       std::vector<std::vector<std::string>>{{"paint", "--help"},
                                             {"help", "paint"},
                                             {"paint", "-h", "--bogus_x"}}) {
    SCOPED_TRACE(words[0] + " " + words[1]);
    const Outcome o = Run(words);
    if (words.size() == 3) {
      EXPECT_EQ(o.exit_code, 2);  // a bad flag is still an error
      continue;
    }
    EXPECT_EQ(o.exit_code, 0) << o.err;
    EXPECT_THAT(o.out, HasSubstr("Usage: prog paint THING"));
    EXPECT_THAT(o.out, HasSubstr("-c, --table_test_color"));
    EXPECT_THAT(o.out, HasSubstr("the color (default: red)"));
    // The command's own wording for a shared flag.
    EXPECT_THAT(o.out, HasSubstr("coats of paint"));
    EXPECT_THAT(o.out, Not(HasSubstr("a test flag")));
    EXPECT_THAT(o.out, HasSubstr("--table_test_format"));  // global
    EXPECT_THAT(o.out, Not(HasSubstr("table_test_loud")));
    EXPECT_THAT(o.out, Not(HasSubstr("table_test_item")));
    EXPECT_EQ(ran_, "");
  }
}

TEST_F(CommandTableTest, GlobalHelpListsCommandsNotTheirFlags) {
  const Outcome o = Run({"--help"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_THAT(o.out, HasSubstr("paint  paint a thing"));
  EXPECT_THAT(o.out, HasSubstr("shout  shout about it"));
  EXPECT_THAT(o.out, HasSubstr("--table_test_format"));
  EXPECT_THAT(o.out, Not(HasSubstr("table_test_color")));
  EXPECT_THAT(o.out, HasSubstr("Exit codes"));
  // No command: the same on stderr, exit 2.
  const Outcome none = Run({});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("paint  paint a thing"));
}

TEST_F(CommandTableTest, VersionAndUnknownCommand) {
  options_.version_extra = [] { return std::string("extra 1\n"); };
  const Outcome v = Run({"--version"});
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_THAT(v.out, ::testing::StartsWith("prog 0."));
  EXPECT_THAT(v.out, HasSubstr("(planner "));
  EXPECT_THAT(v.out, HasSubstr("extra 1\n"));
  const Outcome u = Run({"frob"});
  EXPECT_EQ(u.exit_code, 2);
  EXPECT_THAT(u.err, HasSubstr("unknown command \"frob\""));
  EXPECT_EQ(Run({"help", "frob"}).exit_code, 2);
}

TEST_F(CommandTableTest, BeforeRunErrorsExitTwo) {
  options_.before_run = [](const CommandSpec& c) {
    return absl::InvalidArgumentError(c.name + " refused");
  };
  const Outcome o = Run({"paint"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.err, "prog paint: paint refused\n");
  EXPECT_EQ(ran_, "");
}

TEST_F(CommandTableTest, ValidateCatchesATableThatDriftedFromTheFlags) {
  EXPECT_TRUE(CommandTable(options_, commands_).Validate().ok());
  auto unknown = commands_;
  unknown[0].flags.push_back("no_such_flag_anywhere");
  EXPECT_THAT(std::string(CommandTable(options_, unknown).Validate().message()),
              HasSubstr("--no_such_flag_anywhere, which is not defined"));
  auto orphan = commands_;
  orphan[1].flags.erase(orphan[1].flags.begin());  // table_test_loud
  EXPECT_THAT(std::string(CommandTable(options_, orphan).Validate().message()),
              HasSubstr("--table_test_loud"));
  // Run refuses to start with such a table.
  commands_ = orphan;
  EXPECT_EQ(Run({"paint"}).exit_code, 1);
}

}  // namespace
}  // namespace mutwo
