// Every binary prints its usage for --help and exits 0, and refuses unknown
// commands and flags with exit code 2 and a line naming them; each command
// has its own help and refuses the flags of other commands; what can be
// checked is checked before anything is uploaded, so a
// mistyped command costs no upload.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/model_archive.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using mutwo::testing::BinPath;
using mutwo::testing::CommandResult;
using mutwo::testing::RunCommand;

class BinaryHelp : public ::testing::TestWithParam<const char*> {};

// A build without the worker (MUTWO_BUILD_WORKER=OFF) has no mutwo-worker
// to run: its cases are skipped there, saying so, instead of failing.
#if MUTWO_HAS_WORKER
#define MUTWO_SKIP_WITHOUT_WORKER() \
  do {                              \
  } while (false)
#else
#define MUTWO_SKIP_WITHOUT_WORKER() \
  GTEST_SKIP() << "built without the worker (MUTWO_BUILD_WORKER=OFF)"
#endif

TEST_P(BinaryHelp, HelpExitsZeroWithUsage) {
  if (std::string(GetParam()) == "mutwo-worker") MUTWO_SKIP_WITHOUT_WORKER();
  CommandResult r = RunCommand(BinPath(GetParam()) + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Usage: " + std::string(GetParam())));
}

TEST_P(BinaryHelp, UnknownFlagExitsTwo) {
  if (std::string(GetParam()) == "mutwo-worker") MUTWO_SKIP_WITHOUT_WORKER();
  CommandResult r = RunCommand(BinPath(GetParam()) + " --no_such_flag=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("unknown flag \"--no_such_flag\""));
}

TEST_P(BinaryHelp, VersionExitsZero) {
  if (std::string(GetParam()) == "mutwo-worker") MUTWO_SKIP_WITHOUT_WORKER();
  CommandResult r = RunCommand(BinPath(GetParam()) + " --version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::StartsWith(std::string(GetParam()) + " 0."));
  EXPECT_THAT(r.output, HasSubstr("(planner mutwo-planner-"));
}

TEST_P(BinaryHelp, HelpHasNoDuplicatedDefaultsNorOneLetterLongFlags) {
  if (std::string(GetParam()) == "mutwo-worker") MUTWO_SKIP_WITHOUT_WORKER();
  CommandResult r = RunCommand(BinPath(GetParam()) + " --help");
  EXPECT_THAT(r.output, Not(HasSubstr(") (default:"))) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("(default: \"\")"))) << r.output;
  EXPECT_THAT(r.output, Not(::testing::ContainsRegex("--[a-z] "))) << r.output;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    EXPECT_LE(line.size(), 80u) << line;
  }
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

// Nothing listens on port 1: a command that got as far as an RPC exits 4,
// so exit 2 proves the refusal came first.
const char kNoServer[] = " --server=127.0.0.1:1 --timeout_ms=2000";

std::string Mutwo(const std::string& args) {
  return BinPath("mutwo") + " " + args;
}

TEST(MutwoHelp, EachCommandPrintsItsUsageAndOnlyItsFlags) {
  for (const std::string& form : {"plan --help", "help plan", "plan -h"}) {
    CommandResult r = RunCommand(Mutwo(form));
    EXPECT_EQ(r.exit_code, 0) << form << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("Usage: mutwo plan PROFILE.json")) << form;
    EXPECT_THAT(r.output, HasSubstr("--policy")) << form;
    EXPECT_THAT(r.output, Not(HasSubstr("--wait"))) << form;
    EXPECT_THAT(r.output, Not(HasSubstr("--device_kind"))) << form;
    EXPECT_THAT(r.output, Not(HasSubstr("--server"))) << form;  // offline
  }
  CommandResult top = RunCommand(Mutwo("--help"));
  EXPECT_THAT(top.output, HasSubstr("  watch "));
  EXPECT_THAT(top.output, Not(HasSubstr("--budget")));  // commands' flags
  CommandResult plot = RunCommand(Mutwo("plot --help"));
  EXPECT_THAT(plot.output, HasSubstr("-o, --out"));
  CommandResult submit = RunCommand(Mutwo("submit --help"));
  EXPECT_THAT(submit.output, HasSubstr("(default: random)"));
  EXPECT_THAT(submit.output, HasSubstr("--unbatched"));
}

TEST(MutwoFlags, FlagsOfOtherCommandsAreRefusedNamingFlagAndCommand) {
  CommandResult r = RunCommand(
      Mutwo("plan p.json --budget 60% --wait --kind batch --device_kind cuda"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--wait does not apply to \"plan\""));
  r = RunCommand(Mutwo("jobs --batch 8") + kNoServer);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--batch does not apply to \"jobs\""));
  r = RunCommand(Mutwo("plan p.json --budget 60% --server=x:1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--server does not apply to \"plan\""));
}

TEST(MutwoFlags, BareNumberBudgetsAreRefusedAsAmbiguous) {
  CommandResult r = RunCommand(Mutwo("plan p.json --budget 60"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("say 60% or 60MiB or 60B"));
  r = RunCommand(Mutwo("schedule job-1 --batch 8 --budget 60") + kNoServer);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("a bare number is ambiguous"));
}

// Memory sizes need a unit, as budgets do; refused before any file is read.
TEST(MutwoFlags, BareNumberSizesAreRefusedAsAmbiguous) {
  CommandResult r =
      RunCommand(Mutwo("max-batch /nonexistent/a.json /nonexistent/b.json "
                       "--capacity 80"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--capacity \"80\": a bare number is "
                                  "ambiguous; say 80GiB, 80GB or 80B"));
  MUTWO_SKIP_WITHOUT_WORKER();  // the rest is mutwo-worker's
  r = RunCommand(BinPath("mutwo-worker") +
                 " profile /nonexistent.pt --input x:float32[B,4] --batch 2 "
                 "--memory_limit 300");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--memory_limit \"300\": a bare number is "
                                  "ambiguous"));
  r = RunCommand(BinPath("mutwo-worker") +
                 " serve --server=127.0.0.1:1 --task_memory_limit=16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--task_memory_limit \"16\": a bare "
                                  "number is ambiguous"));
}

TEST(MutwoFlags, EnumValuesInAnyCase) {
  // Accepted: the command gets as far as the (missing) server.
  for (const std::string& args :
       {"jobs --state succeeded", "jobs --state Failed --output JSON",
        "schedule j --batch 8 --policy SQRT_N", "health --output Json"}) {
    CommandResult r = RunCommand(Mutwo(args) + kNoServer);
    EXPECT_EQ(r.exit_code, 4) << args << "\n" << r.output;
  }
  CommandResult bad = RunCommand(Mutwo("jobs --state done") + kNoServer);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--state \"done\": use queued"));
}

class MutwoSubmitChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    // A model whose forward takes x and an optional y: the CLI checks the
    // archive against the inputs before it uploads (then finds no server).
    model_ = ::testing::TempDir() + "/binaries_test_model.pt";
    std::ofstream(model_, std::ios::binary)
        << mutwo::testing::ModelArchiveWithForward(
               "x: Tensor, y: Optional[Tensor]=None");
  }
  CommandResult Submit(const std::string& args) {
    return RunCommand(Mutwo("submit " + model_ + " " + args) + kNoServer);
  }
  std::string model_;
};

TEST_F(MutwoSubmitChecks, EverythingCheckableIsCheckedBeforeTheUpload) {
  const std::string ok = "--input x:float32[B,3,32,32] --batch 8 --budget 60%";
  // The well-formed request gets as far as the upload (no server: 4).
  EXPECT_EQ(Submit(ok).exit_code, 4);
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {ok + " --device_kind tpu",
            "--device_kind \"tpu\": use cpu or cuda"},
           {"--input x:float32[64,3,32,32] --batch 8 --budget 60%",
            "input spec \"x:float32[64,3,32,32]\" has no batch dimension B"},
           {"--input x:float32[B,3] --batch 8 --budget 60",
            "a bare number is ambiguous"},
           {"--input x:float32[B,3] --batch 8:4 --budget 60%", "batch sizes"},
           {ok + " --loss hinge", "loss \"hinge\""},
           {ok + " --optimizer lbfgs", "optimizer \"lbfgs\""},
           {ok + " --unbatched y", "--unbatched \"y\""},
           {ok + " --max_overhead -1", "--max_overhead"},
           {ok + " --capacity 60%", "--capacity \"60%\": give bytes"},
           {ok + " --capacity 16", "--capacity \"16\": give bytes"},
           {ok + " --budget knee", "or floor (the lowest budget that fits)"},
       }) {
    CommandResult r = Submit(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.output, Not(HasSubstr("uploaded"))) << c.args;
  }
  // `auto` budgets and a capacity in bytes or of the device are accepted.
  EXPECT_EQ(Submit(ok + " --budget AUTO --capacity 16GiB").exit_code, 4);
  EXPECT_EQ(Submit(ok + " --capacity 90%dev").exit_code, 4);
  // Declared unbatched and upper-case names are accepted.
  EXPECT_EQ(Submit("--input x:float32[64,3] --unbatched x --input y:FLOAT32[B] "
                   "--batch 8 --budget 60% --device_kind CUDA --loss MEAN")
                .exit_code,
            4);
}

TEST(WorkerHelp, ProfileHelpAndRefusedFlags) {
  MUTWO_SKIP_WITHOUT_WORKER();
  CommandResult r = RunCommand(BinPath("mutwo-worker") + " profile --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Usage: mutwo-worker profile MODEL.pt"));
  EXPECT_THAT(r.output, HasSubstr("--output"));
  EXPECT_THAT(r.output, Not(HasSubstr("--schedule")));
  EXPECT_THAT(r.output, Not(HasSubstr("--work_dir")));
  r = RunCommand(BinPath("mutwo-worker") +
                 " profile m.pt --input x:float32[B,4] --batch 2 --force");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--force does not apply to \"profile\""));
  r = RunCommand(BinPath("mutwo-worker") + " help execute");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--schedule"));
  EXPECT_THAT(r.output, HasSubstr("--baseline"));
}

TEST(WorkerHelp, InputWithoutBatchDimensionIsRefusedBeforeLoading) {
  MUTWO_SKIP_WITHOUT_WORKER();
  // The model file does not exist: the spec is refused before it is read.
  CommandResult r = RunCommand(BinPath("mutwo-worker") +
                               " profile /nonexistent.pt --input "
                               "x:float32[64,3,32,32] --batch 32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"x:float32[64,3,32,32]\" has no batch "
                                  "dimension B"));
}

// `serve` without --work_dir keeps its model cache where caches go
// ($XDG_CACHE_HOME/mutwo/worker), not in the directory it was started in (a
// checkout).
TEST(WorkerServe, DefaultWorkDirIsTheUserCache) {
  MUTWO_SKIP_WITHOUT_WORKER();
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / absl::StrCat("mutwo_workdir_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "cwd");
  // No server listens on port 1: serve keeps retrying until the TERM.
  CommandResult r = RunCommand(absl::StrCat(
      "cd ", (dir / "cwd").string(),
      " && XDG_CACHE_HOME=", (dir / "cache").string(), " timeout -s TERM 10 ",
      BinPath("mutwo-worker"), " serve --server=127.0.0.1:1 --device=cpu"));
  EXPECT_TRUE(fs::is_directory(dir / "cache" / "mutwo" / "worker" / "models"))
      << r.output;
  EXPECT_TRUE(fs::is_empty(dir / "cwd")) << r.output;
  fs::remove_all(dir);
}

// `serve` without --server connects where $MUTWO_SERVER says, as the CLI
// does: one environment variable points the worker and the CLI at one
// server.
TEST(WorkerServe, ConnectsToMutwoServer) {
  MUTWO_SKIP_WITHOUT_WORKER();
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / absl::StrCat("mutwo_env_", getpid());
  fs::create_directories(dir);
  // No server listens on port 9: serve keeps retrying, naming the address.
  CommandResult r = RunCommand(absl::StrCat(
      "MUTWO_SERVER=127.0.0.1:9 timeout -s TERM 5 ", BinPath("mutwo-worker"),
      " serve --device=cpu --work_dir=", dir.string()));
  EXPECT_THAT(r.output, HasSubstr("register with 127.0.0.1:9")) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("127.0.0.1:50051"))) << r.output;
  fs::remove_all(dir);
}

}  // namespace
