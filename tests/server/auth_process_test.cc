// Authentication with the real processes: mutwo-server with a
// tokens file, `mutwo-worker serve` and the `mutwo` CLI with their tokens
// run a job end to end on loopback; other clients do not see it; and no
// token appears in any log or output, at trace level.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/proto_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mutwo/v1/types.pb.h"
#include "server/auth/token_table.h"
#include "tests/testing/command.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace mutwo {
namespace {

namespace fs = std::filesystem;
using testing::BinPath;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::Subprocess;

constexpr char kAliceToken[] = "alice-Zq8vR2mX7kP4wL9nB3tY6cF1";
constexpr char kBobToken[] = "bob-Hj5sD8gK2lM6nQ9rT3vW7xZ0";
constexpr char kWorkerToken[] = "worker-Pa4Sd7Fg1Hj3Kl6Zx9Cv2Bn5";
constexpr char kWrongToken[] = "wrong-Qw3Er6Ty9Ui2Op5As8Df1G";

class AuthProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("mutwo_auth_process_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Write("tokens.txt",
          absl::StrCat("client alice ", auth::TokenHashField(kAliceToken),
                       "\nclient bob ", auth::TokenHashField(kBobToken),
                       "\nworker gpu-node-1 ",
                       auth::TokenHashField(kWorkerToken), "\n"));
    Write("alice.token", absl::StrCat(kAliceToken, "\n"));
    Write("worker.token", absl::StrCat(kWorkerToken, "\n"));
    Write("wrong.token", absl::StrCat(kWrongToken, "\n"));
  }

  void TearDown() override {
    if (worker_.running()) worker_.Kill(SIGKILL);
    if (server_.running()) server_.Kill(SIGKILL);
    if (HasFailure()) {
      std::cerr << "---- server log ----\n"
                << server_.Log() << "---- worker log ----\n"
                << worker_.Log();
    }
    fs::remove_all(dir_);
  }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }
  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Cli(const std::string& args) const {
    return absl::StrCat(BinPath("mutwo"), " ", args, " --server=", Address(),
                        " --timeout_ms=10000");
  }

  fs::path dir_;
  int port_ = 0;
  Subprocess server_;
  Subprocess worker_;
};

TEST_F(AuthProcessTest, AJobRunsWithTokensAndNoTokenIsEverLogged) {
  auto model = RunCommand(absl::StrCat(
      "/usr/bin/python3 -c \"import torch; torch.jit.script(torch.nn."
      "Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn."
      "Linear(16, 4))).save('",
      Path("mlp.pt"), "')\""));
  ASSERT_EQ(model.exit_code, 0) << model.output;
  const auto ports = testing::StartOnFreePorts(
      server_,
      [&](Subprocess& server, const testing::ServerPorts& p) {
        port_ = p.port;
        return server.Start(
            {BinPath("mutwo-server"), "--listen=" + Address(),
             "--metrics_listen=", "--data_dir=" + Path("data"),
             "--log_level=trace", "--auth_tokens_file=" + Path("tokens.txt")},
            Path("server.log"));
      },
      [&](const testing::ServerPorts&) {
        return RunCommand(Cli("health")).exit_code == 0;  // no token needed
      });
  ASSERT_TRUE(ports.has_value()) << server_.Log();
  ASSERT_TRUE(worker_.Start(
      {BinPath("mutwo-worker"), "serve", "--server=" + Address(),
       "--device=cpu", "--work_dir=" + Path("worker"), "--log_level=trace",
       "--token_file=" + Path("worker.token")},
      Path("worker.log")));

  // alice submits with her token file and waits for the result.
  auto submit = RunCommand(Cli(
      absl::StrCat("submit ", Path("mlp.pt"),
                   " --input=x:float32[B,32] --batch=8 --budget=64MiB --wait "
                   "--output=json --token_file=",
                   Path("alice.token"))));
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  v1::Job job;
  const size_t brace = submit.output.find('{');
  ASSERT_NE(brace, std::string::npos) << submit.output;
  ASSERT_TRUE(ProtoFromJson(submit.output.substr(brace), "job", &job).ok())
      << submit.output;
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << job.error();
  EXPECT_EQ(job.owner(), "alice");

  // bob (token in the environment) sees no job; no token: refused.
  auto bob = RunCommand(
      absl::StrCat("MUTWO_TOKEN=", kBobToken, " ", Cli("jobs --output=json")));
  EXPECT_EQ(bob.exit_code, 0) << bob.output;
  EXPECT_THAT(bob.output, Not(HasSubstr("job-")));
  auto none = RunCommand(Cli("jobs"));
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_THAT(none.output, HasSubstr("needs a bearer token"));
  auto wrong = RunCommand(
      absl::StrCat("MUTWO_TOKEN_FILE=", Path("wrong.token"), " ", Cli("jobs")));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_THAT(wrong.output, HasSubstr("not valid"));
  // A token is never sent in clear text to a non-loopback address.
  auto far = RunCommand(absl::StrCat(
      BinPath("mutwo"),
      " jobs --server=192.0.2.1:50051 --token_file=", Path("alice.token")));
  EXPECT_EQ(far.exit_code, 2) << far.output;
  EXPECT_THAT(far.output, HasSubstr("--tls_ca"));

  worker_.Kill(SIGTERM);
  worker_.Wait(std::chrono::seconds(20));
  server_.Kill(SIGTERM);
  server_.Wait(std::chrono::seconds(20));
  const std::string everything =
      absl::StrCat(server_.Log(), worker_.Log(), submit.output, bob.output,
                   none.output, wrong.output, far.output);
  EXPECT_THAT(everything, HasSubstr("bearer tokens (3 principals)"));
  EXPECT_THAT(everything, HasSubstr("leased to"));  // the logs are there
  for (const char* token :
       {kAliceToken, kBobToken, kWorkerToken, kWrongToken}) {
    EXPECT_THAT(everything, Not(HasSubstr(token))) << token;
  }
}

}  // namespace
}  // namespace mutwo
