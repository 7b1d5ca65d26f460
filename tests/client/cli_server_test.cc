// The `mutwo` CLI against a real mutwo-server on loopback (no worker unless
// a test starts the fake one): the server named by MUTWO_SERVER, the time
// columns of `mutwo jobs`, the exit code of `mutwo job` for a final job, the
// `latest` shorthand.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/planner.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace mutwo {
namespace {

using testing::BinPath;
using testing::CommandResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::Subprocess;

class CliServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("cli_server_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    server_ = std::make_unique<Subprocess>();
    const auto ports = testing::StartMutwoServerOnFreePorts(
        *server_, dir_, {"--log_level=warn"},
        [&](const testing::ServerPorts& p) {
          channel_ = grpc::CreateChannel(p.address(),
                                         grpc::InsecureChannelCredentials());
          return channel_->WaitForConnected(std::chrono::system_clock::now() +
                                            std::chrono::milliseconds(250));
        });
    ASSERT_TRUE(ports.has_value())
        << "server did not start: " << server_->Log();
    address_ = ports->address();
    metrics_port_ = ports->metrics_port;
    model_ = (dir_ / "model.pt").string();
    std::ofstream(model_, std::ios::binary)
        << testing::UncheckedModelArchive("the fake worker never reads it");
  }
  void TearDown() override {
    stop_worker_ = true;
    if (worker_.joinable()) worker_.join();
    if (HasFailure()) std::cerr << server_->Log();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // `mutwo ARGS` with MUTWO_SERVER naming the test's server, no --server.
  CommandResult Cli(const std::string& args) {
    return RunCommand("MUTWO_SERVER=" + address_ + " " + BinPath("mutwo") +
                      " " + args);
  }

  // Submits a job (no --wait); returns its id.
  std::string Submit(const std::string& budget = "80%") {
    CommandResult r = Cli(
        "submit " + model_ +
        " --input x:float32[B,16] --batch 2 --output=json --budget " + budget);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    static const std::regex re("\"job_id\": \"([^\"]+)\"");
    if (!std::regex_search(r.output, m, re)) {
      ADD_FAILURE() << "no job id in: " << r.output;
      return "";
    }
    return m[1];
  }

  // The server's count of model uploads with `result` (stored,
  // deduplicated), from its /metrics; -1 when it is not there.
  double Uploads(const std::string& result) {
    const std::string text = testing::HttpGet(metrics_port_, "/metrics");
    std::smatch m;
    const std::regex re("mutwo_model_uploads_total\\{result=\"" + result +
                        "\"\\} ([0-9.e+]+)");
    return std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
  }

  // Uploads the file at `path` and submits a job for it with `inputs`
  // straight over RPC, as a client without the CLI's check would: the
  // server's own check at submit answers.
  grpc::Status SubmitOverRpc(const std::string& path, const std::string& name,
                             const std::vector<std::string>& inputs) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream read;
    read << in.rdbuf();
    const std::string bytes = read.str();
    const std::string sha = Sha256Hex(bytes);
    auto stub = v1::Planner::NewStub(channel_);
    {
      grpc::ClientContext context;
      v1::UploadModelResponse response;
      auto writer = stub->UploadModel(&context, &response);
      v1::UploadModelRequest header;
      header.mutable_header()->set_sha256(sha);
      header.mutable_header()->set_size_bytes(
          static_cast<int64_t>(bytes.size()));
      header.mutable_header()->set_name(name);
      v1::UploadModelRequest chunk;
      chunk.set_chunk(bytes);
      if (!writer->Write(header) || !writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "upload write");
      }
      writer->WritesDone();
      if (grpc::Status s = writer->Finish(); !s.ok()) return s;
    }
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_sha256(sha);
    request.mutable_spec()->set_model_name(name);
    for (const std::string& input : inputs) {
      *request.mutable_spec()->add_inputs() = *ParseTensorSpec(input);
    }
    request.mutable_spec()->add_batch_sizes(2);
    request.mutable_spec()->add_budgets()->set_fraction_of_baseline(0.8);
    v1::SubmitJobResponse response;
    return stub->SubmitJob(&context, request, &response);
  }

  void StartFakeWorker(int fail_one_in, double step_time_scale = 1.0) {
    stop_worker_ = false;
    worker_ = std::thread([this, fail_one_in, step_time_scale] {
      testing::RunFakeWorker(channel_, stop_worker_, 7, fail_one_in,
                             step_time_scale);
    });
  }
  void StopFakeWorker() {
    stop_worker_ = true;
    if (worker_.joinable()) worker_.join();
  }

  // Polls `mutwo job ID` until the job is final; returns that last run.
  CommandResult WaitFinal(const std::string& id) {
    CommandResult r;
    for (int i = 0; i < 400; ++i) {
      r = Cli("job " + id);
      if (r.output.find("SUCCEEDED") != std::string::npos ||
          r.output.find("FAILED") != std::string::npos ||
          r.output.find("CANCELLED") != std::string::npos) {
        return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "job " << id << " not final: " << r.output;
    return r;
  }

  std::filesystem::path dir_;
  std::string address_, model_;
  int metrics_port_ = 0;
  std::unique_ptr<Subprocess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> stop_worker_{false};
  std::thread worker_;
};

// A job that cannot run is refused at submit, before it is queued, with the
// message the worker would give (the CLI reads forward's arguments from the
// archive's code without loading it, as mutwo-server does): an input
// missing or naming no argument, a torch.save pickle, a truncated file.
// Exit 2, nothing uploaded (the server counts no upload), no job, and what
// was stored before (a job, its model) is still there.
TEST_F(CliServerTest, SubmitRefusesAJobThatCannotRunBeforeQueueingIt) {
  const std::string script = (dir_ / "make.py").string();
  std::ofstream(script) << R"(import sys, torch
from typing import Optional
class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, image, text, mask: Optional[torch.Tensor] = None):
        return self.conv(image).mean(dim=(2, 3)) + self.fc(text)
out = sys.argv[1]
torch.jit.script(TwoInputs()).save(out + "/two_inputs.pt")
torch.save(TwoInputs(), out + "/pickle.pt")
data = open(out + "/two_inputs.pt", "rb").read()
open(out + "/truncated.pt", "wb").write(data[: len(data) * 2 // 3])
)";
  const CommandResult made =
      RunCommand("/usr/bin/python3 " + script + " " + dir_.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string before = Submit();
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(Uploads("stored"), 1);
  const std::string two_inputs = (dir_ / "two_inputs.pt").string();
  const std::string spec = " --batch 2 --budget 80%";

  CommandResult missing =
      Cli("submit " + two_inputs + " --input image:float32[B,3,8,8]" + spec);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output,
              HasSubstr("model two_inputs.pt: forward's argument text "
                        "(Tensor) has no --input spec and no default: give "
                        "--input text:DTYPE[DIMS]"));
  EXPECT_THAT(missing.output, Not(HasSubstr("submitted")));
  EXPECT_THAT(missing.output, Not(HasSubstr("uploaded")));

  CommandResult misnamed = Cli("submit " + two_inputs +
                               " --input image:float32[B,3,8,8]"
                               " --input txt:float32[B,8]" +
                               spec);
  EXPECT_EQ(misnamed.exit_code, 2) << misnamed.output;
  EXPECT_THAT(misnamed.output, HasSubstr("--input txt names no argument of "
                                         "forward(image: Tensor, text: "
                                         "Tensor, mask: Optional[Tensor] = "
                                         "None)"));

  CommandResult pickle = Cli("submit " + (dir_ / "pickle.pt").string() +
                             " --input x:float32[B,8]" + spec);
  EXPECT_EQ(pickle.exit_code, 2) << pickle.output;
  EXPECT_THAT(pickle.output, HasSubstr("this is a torch.save pickle"));
  EXPECT_THAT(pickle.output, HasSubstr("torch.jit.script(model).save(path)"));

  // A zip bomb (256 MiB of deflated zeros in a ~256 KiB file): refused
  // from the zip directory, never inflated.
  const std::string bomb = (dir_ / "bomb.pt").string();
  const CommandResult made_bomb = RunCommand(absl::StrCat(
      "/usr/bin/python3 ", MUTWO_SOURCE_DIR, "/tests/testing/make_zip_bomb.py ",
      bomb, " ", int64_t{1} << 28));
  ASSERT_EQ(made_bomb.exit_code, 0) << made_bomb.output;
  CommandResult zip_bomb =
      Cli("submit " + bomb + " --input x:float32[B,4]" + spec);
  EXPECT_EQ(zip_bomb.exit_code, 2) << zip_bomb.output;
  EXPECT_THAT(zip_bomb.output, HasSubstr("refused as a zip bomb: the archive "
                                         "inflates to 256."));

  CommandResult truncated = Cli("submit " + (dir_ / "truncated.pt").string() +
                                " --input x:float32[B,8]" + spec);
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_THAT(truncated.output,
              HasSubstr("cannot load the TorchScript archive (truncated or "
                        "corrupt?)"));

  // Nothing uploaded or queued by the refusals; the job before is still
  // there.
  EXPECT_EQ(Uploads("stored"), 1);
  EXPECT_EQ(Uploads("deduplicated"), 0);
  CommandResult jobs = Cli("jobs --output=json");
  ASSERT_EQ(jobs.exit_code, 0) << jobs.output;
  v1::ListJobsResponse list;
  ASSERT_TRUE(ProtoFromJson(jobs.output, "jobs", &list).ok()) << jobs.output;
  ASSERT_EQ(list.jobs_size(), 1) << jobs.output;
  EXPECT_EQ(list.jobs(0).job_id(), before);

  // The same model with its inputs given out of order by name and the
  // Optional one left out is uploaded (for the first time) and queued.
  CommandResult good = Cli("submit " + two_inputs +
                           " --input text:float32[B,8]"
                           " --input image:float32[B,3,8,8]" +
                           spec);
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_THAT(good.output, HasSubstr("uploaded two_inputs"));
  EXPECT_THAT(good.output, Not(HasSubstr("already stored")));
  EXPECT_THAT(good.output, HasSubstr("submitted"));
  EXPECT_EQ(Uploads("stored"), 2);

  // A client without the CLI's check uploads; the server refuses the job
  // at submit with the message the CLI gave (one function, both sides).
  const auto cli_message = [](const CommandResult& r) {
    const std::string prefix = "mutwo submit: ";
    const size_t at = r.output.find(prefix);
    return at == std::string::npos
               ? r.output
               : r.output.substr(at + prefix.size(),
                                 r.output.find('\n', at) - at - prefix.size());
  };
  const grpc::Status server_missing =
      SubmitOverRpc(two_inputs, "two_inputs", {"image:float32[B,3,8,8]"});
  EXPECT_EQ(server_missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_missing.error_message(), cli_message(missing));
  const grpc::Status server_pickle = SubmitOverRpc(
      (dir_ / "pickle.pt").string(), "pickle", {"x:float32[B,8]"});
  EXPECT_EQ(server_pickle.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_pickle.error_message(), cli_message(pickle));
  const grpc::Status server_bomb =
      SubmitOverRpc(bomb, "bomb", {"x:float32[B,4]"});
  EXPECT_EQ(server_bomb.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_bomb.error_message(), cli_message(zip_bomb));
}

// Every command that talks to the server reaches the one MUTWO_SERVER
// names; --server still wins over it.
TEST_F(CliServerTest, MutwoServerIsHonouredByEveryCommand) {
  const std::string id = Submit();
  ASSERT_FALSE(id.empty());
  // Final, so that `watch` returns at once (no worker runs it).
  ASSERT_EQ(Cli("cancel " + id).exit_code, 0);
  const std::vector<std::string> commands = {
      "health",
      "workers",
      "jobs",
      "job " + id,
      "watch " + id,
      "schedule " + id + " --batch 2",
      "profile " + id + " --batch 2",
      "plot " + id + " --kind timeline --batch 2 -o " +
          (dir_ / "t.json").string(),
      "cancel " + id,
  };
  for (const std::string& command : commands) {
    // Nothing listens on port 1: a command that reads MUTWO_SERVER fails
    // there, naming it.
    CommandResult away =
        RunCommand("MUTWO_SERVER=127.0.0.1:1 " + BinPath("mutwo") + " " +
                   command + " --timeout_ms=2000");
    EXPECT_EQ(away.exit_code, 4) << command << "\n" << away.output;
    EXPECT_THAT(away.output, HasSubstr("127.0.0.1:1")) << command;
    EXPECT_THAT(away.output, Not(HasSubstr("50051"))) << command;
    // The server MUTWO_SERVER names answers (whatever the job's state).
    CommandResult here = Cli(command);
    EXPECT_NE(here.exit_code, 4) << command << "\n" << here.output;
    EXPECT_THAT(here.output, Not(HasSubstr("127.0.0.1:50051"))) << command;
  }
  CommandResult flag =
      RunCommand("MUTWO_SERVER=127.0.0.1:1 " + BinPath("mutwo") +
                 " jobs --server=" + address_);
  EXPECT_EQ(flag.exit_code, 0) << flag.output;
  EXPECT_THAT(flag.output, HasSubstr(id));
}

TEST_F(CliServerTest, JobsListsWhenEachJobWasSubmittedAndLastUpdated) {
  const std::string id = Submit();
  CommandResult r = Cli("jobs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SUBMITTED"));
  EXPECT_THAT(r.output, HasSubstr("UPDATED"));
  const std::string today =
      absl::FormatTime("%Y-%m-%d", absl::Now(), absl::LocalTimeZone());
  EXPECT_THAT(r.output, HasSubstr(today)) << r.output;
  EXPECT_THAT(r.output, ::testing::ContainsRegex("(just now|[0-9]+s ago)"))
      << r.output;
}

// A script can tell a failed job from a good one by `mutwo job`'s exit
// code, as by `watch`'s: 0 running or succeeded, 1 failed or cancelled.
TEST_F(CliServerTest, JobExitsOneForAFailedOrCancelledJob) {
  const std::string queued = Submit();
  EXPECT_EQ(Cli("job " + queued).exit_code, 0);  // no verdict yet
  EXPECT_EQ(Cli("cancel " + queued).exit_code, 0);
  CommandResult cancelled = Cli("job " + queued);
  EXPECT_THAT(cancelled.output, HasSubstr("CANCELLED"));
  EXPECT_EQ(cancelled.exit_code, 1) << cancelled.output;
  EXPECT_EQ(Cli("job " + queued + " --output=json").exit_code, 1);

  StartFakeWorker(/*fail_one_in=*/1);  // every task fails: the job FAILED
  const std::string failed = Submit();
  CommandResult r = WaitFinal(failed);
  EXPECT_THAT(r.output, HasSubstr("FAILED"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST_F(CliServerTest, JobExitsZeroForASucceededJob) {
  StartFakeWorker(/*fail_one_in=*/0);
  const std::string id = Submit();
  CommandResult r = WaitFinal(id);
  EXPECT_THAT(r.output, HasSubstr("SUCCEEDED"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A budget that fits at no batch size: 3, as `watch`; with --output json
  // the JSON alone (stdout and stderr together are still one JSON object).
  const std::string nowhere = Submit("1B");
  CommandResult text = WaitFinal(nowhere);
  EXPECT_EQ(text.exit_code, 3) << text.output;
  EXPECT_THAT(text.output, HasSubstr("budget 1B fits at no batch size"));
  CommandResult json = Cli("job " + nowhere + " --output=json");
  EXPECT_EQ(json.exit_code, 3);
  EXPECT_EQ(json.output.front(), '{') << json.output;
  EXPECT_EQ(json.output.substr(json.output.size() - 2), "}\n") << json.output;
}

TEST_F(CliServerTest, LatestNamesTheNewestJob) {
  CommandResult none = Cli("job latest");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("has none yet"));
  const std::string first = Submit();
  const std::string second = Submit("70%");
  ASSERT_NE(first, second);
  for (const std::string& form : {"latest", "-"}) {
    CommandResult r = Cli("job " + std::string(form));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("job " + second)) << form;
    EXPECT_THAT(r.output, Not(HasSubstr(first))) << form;
  }
  CommandResult json = Cli("job latest --output=json");
  EXPECT_THAT(json.output, HasSubstr("\"job_id\": \"" + second + "\""));
  // Cancel takes the id only: "latest" could be someone else's new job.
  CommandResult cancel = Cli("cancel latest");
  EXPECT_EQ(cancel.exit_code, 2) << cancel.output;
  EXPECT_THAT(cancel.output, HasSubstr("cancel needs the job's id"));
}

// One line per step of the job: never two lines in a row with the same
// state, counts and running task (a task's report and the next task's lease
// are one step).
TEST_F(CliServerTest, SubmitWaitPrintsOneProgressLinePerStep) {
  StartFakeWorker(0);
  CommandResult r = Cli("submit " + model_ +
                        " --input x:float32[B,16] --batch 2,4,8 --budget 80% "
                        "--budget 60% --wait");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  static const std::regex progress(
      "^[0-9:]{8} \\+[0-9hms]+  ([A-Z]+) +profiled ([0-9]+/[0-9]+) batch "
      "sizes, ([0-9]+/[0-9]+) budgets decided(?:, ~[0-9hms]+ left)?"
      "(?:; running (.*))?$");
  std::vector<std::string> steps;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, progress)) continue;
    // A task that starts while the counts stay (a re-validation round,
    // then the next budget's) is a step of its own.
    const std::string step =
        absl::StrCat(m[1].str(), " ", m[2].str(), " ", m[3].str(),
                     m[4].matched ? " " + m[4].str() : "");
    EXPECT_TRUE(steps.empty() || steps.back() != step)
        << "two lines for " << step << ":\n"
        << r.output;
    steps.push_back(step);
  }
  EXPECT_GE(steps.size(), 3u) << r.output;
  EXPECT_EQ(steps.back(), "SUCCEEDED 3/3 6/6") << r.output;
}

// A job is answered from its own measurement: the schedule cache binds each
// entry to the profile it was planned from (its digest and worker are in the
// key), so a second job whose profile measured the step 2x faster is planned
// from that profile, and its table shows each plan beside this job's own
// baseline, not an earlier job's (the cache shares an entry between jobs
// only from a trusted profile that the job's own agrees with:
// tenant_isolation_test).
TEST_F(CliServerTest, AJobIsPlannedFromItsOwnProfileNotAnEarlierOne) {
  StartFakeWorker(0);
  CommandResult first = WaitFinal(Submit());
  ASSERT_THAT(first.output, HasSubstr("SUCCEEDED"));
  StopFakeWorker();
  StartFakeWorker(0, /*step_time_scale=*/0.5);  // this job measures 2x faster
  const std::string id = Submit();
  CommandResult again = WaitFinal(id);
  ASSERT_THAT(again.output, HasSubstr("SUCCEEDED"));
  // "2  80%  20.00 MiB  24.0  14.00 MiB  27.0  +12.5%": base ms, plan ms,
  // overhead (the fake worker scales the step's time, not each op's).
  static const std::regex row(
      "\\n +2 +80% +[0-9.]+ MiB +([0-9.]+) +[0-9.]+ MiB +([0-9.]+) "
      "+([-+0-9.]+)%");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(first.output, a, row)) << first.output;
  ASSERT_TRUE(std::regex_search(again.output, b, row)) << again.output;
  EXPECT_EQ(a[1].str(), "24.0") << first.output;
  EXPECT_EQ(b[1].str(), "12.0") << again.output;  // its own baseline
  // Its plan is made from its own, faster op times.
  EXPECT_LT(std::stod(b[2].str()), std::stod(a[2].str())) << again.output;
  EXPECT_THAT(again.output, Not(HasSubstr("earlier profile")));
  EXPECT_THAT(first.output, Not(HasSubstr("earlier profile")));
}

// Waits until `process`'s log holds `text`; false after 10 s.
bool WaitForLog(const Subprocess& process, const std::string& text) {
  for (int i = 0; i < 200; ++i) {
    if (process.Log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Ctrl-C while following a job (no worker: it stays QUEUED) stops the
// following only: exit 130, the job still queued, and the lines printed
// name the commands that watch or cancel that job on that server.
TEST_F(CliServerTest, CtrlCWhileFollowingSaysTheJobKeepsRunningAndHow) {
  const std::string id = Submit();
  for (const std::string& how : {"watch", "submit --wait"}) {
    Subprocess cli;
    std::vector<std::string> argv = {BinPath("mutwo")};
    if (std::string(how) == "watch") {
      argv.insert(argv.end(), {"watch", id});
    } else {
      argv.insert(argv.end(), {"submit", model_, "--input", "x:float32[B,16]",
                               "--batch", "2", "--budget", "90%", "--wait"});
    }
    argv.push_back("--server=" + address_);
    const std::string log = (dir_ / "cli.log").string();
    std::filesystem::remove(log);
    ASSERT_TRUE(cli.Start(argv, log));
    ASSERT_TRUE(WaitForLog(cli, "QUEUED")) << how << ": " << cli.Log();
    cli.Kill(SIGINT);
    EXPECT_EQ(cli.Wait(std::chrono::seconds(10)), 130) << how << cli.Log();
    std::string followed = id;
    if (std::string(how) != "watch") {
      std::smatch m;
      const std::string out = cli.Log();
      ASSERT_TRUE(std::regex_search(out, m, std::regex("job (\\S+) submitted")))
          << out;
      followed = m[1];
    }
    const std::string out = cli.Log();
    EXPECT_THAT(out, HasSubstr("job " + followed + " keeps running"));
    EXPECT_THAT(out,
                HasSubstr("mutwo watch " + followed + " --server=" + address_));
    EXPECT_THAT(
        out, HasSubstr("mutwo cancel " + followed + " --server=" + address_));
    CommandResult job = Cli("job " + followed);
    EXPECT_THAT(job.output, HasSubstr("QUEUED")) << how;
  }
}

}  // namespace
}  // namespace mutwo
