// SIGTERM with work in flight (the drain bar): the real mutwo-server, a real
// `mutwo-worker serve` daemon running a task, a WatchJob stream and lease
// polls open. SIGTERM must end the server (exit 0) within 30 s, and well
// before the 10 s drain timeout: the watch and the polls are answered at
// shutdown instead of holding the drain; the server restarted on the same
// data dir must still know every job it acknowledged, and every job must go
// final once the worker reaches it again. Figures are printed as one JSON
// line.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/proto_io.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace mutwo {
namespace {

using testing::BinPath;
using testing::RunCommand;
using testing::Subprocess;

namespace fs = std::filesystem;

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

class SigtermDrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("mutwo_sigterm_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (worker_ != nullptr) worker_->Kill(SIGKILL);
    if (HasFailure()) {
      std::cerr << "---- server log ----\n"
                << (server_ != nullptr ? server_->Log() : "")
                << "---- worker log ----\n"
                << (worker_ != nullptr ? worker_->Log() : "");
    }
    if (server_ != nullptr) server_->Kill(SIGKILL);
    fs::remove_all(dir_);
  }

  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Cli(const std::string& args) const {
    return absl::StrCat(BinPath("mutwo"), " ", args, " --server=", Address(),
                        " --timeout_ms=5000");
  }

  bool StartOn(Subprocess& server, int port) {
    return server.Start(
        {BinPath("mutwo-server"), absl::StrCat("--listen=127.0.0.1:", port),
         "--metrics_listen=", "--data_dir=" + (dir_ / "data").string(),
         "--lease_timeout_ms=3000", "--drain_timeout_ms=10000"},
        (dir_ / "server.log").string());
  }
  bool Healthy() { return RunCommand(Cli("health")).exit_code == 0; }

  // The first start, on a port found free (another if a parallel test took
  // it first).
  void StartServer() {
    server_ = std::make_unique<Subprocess>();
    const auto ports = testing::StartOnFreePorts(
        *server_,
        [&](Subprocess& server, const testing::ServerPorts& p) {
          port_ = p.port;
          return StartOn(server, port_);
        },
        [&](const testing::ServerPorts&) { return Healthy(); });
    ASSERT_TRUE(ports.has_value())
        << "server did not become healthy: " << server_->Log();
  }

  // A restart on the same port: the worker holds its address.
  void RestartServer() {
    server_ = std::make_unique<Subprocess>();
    ASSERT_TRUE(StartOn(*server_, port_));
    for (int i = 0; i < 100; ++i) {
      if (Healthy()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "server did not become healthy: " << server_->Log();
  }

  std::string Submit(const std::string& model, const std::string& input) {
    auto r = RunCommand(Cli(absl::StrCat(
        "submit ", (fs::path(MUTWO_TEST_MODELS_DIR) / model).string(),
        " --input=", input,
        " --batch=64 --budget=95% --device_kind=cpu --output=json")));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    static const std::regex re("\"job_id\": \"([^\"]+)\"");
    if (!std::regex_search(r.output, m, re)) {
      ADD_FAILURE() << "no job id in: " << r.output;
      return "";
    }
    return m[1];
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& id) {
    auto r = RunCommand(Cli("job " + id + " --output=json"));
    // 1 and 3 are a final job's verdict (failed, a budget fitting nowhere).
    if (r.exit_code != 0 && r.exit_code != 1 && r.exit_code != 3) {
      return absl::NotFoundError(r.output);
    }
    v1::Job job;
    if (absl::Status s = ProtoFromJson(r.output, "job", &job); !s.ok()) {
      return s;
    }
    return job;
  }

  fs::path dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> server_;
  std::unique_ptr<Subprocess> worker_;
};

TEST_F(SigtermDrainTest, ExitsWithin30sWithWorkInFlightAndLosesNothing) {
  StartServer();
  worker_ = std::make_unique<Subprocess>();
  ASSERT_TRUE(worker_->Start(
      {BinPath("mutwo-worker"), "serve", "--server=" + Address(),
       "--device=cpu", "--work_dir=" + (dir_ / "worker").string(),
       "--task_memory_limit=16GiB"},
      (dir_ / "worker.log").string()));
  std::vector<std::string> acknowledged;
  for (int i = 0; i < 2; ++i) {
    acknowledged.push_back(Submit("mlp.pt", "x:float32[B,32]"));
    acknowledged.push_back(Submit("cnn.pt", "x:float32[B,3,16,16]"));
  }
  for (const std::string& id : acknowledged) ASSERT_FALSE(id.empty());

  auto channel =
      grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials());
  // A watch of the last job, read on its own thread: the worker runs one
  // task at a time, so the last job is still open at SIGTERM (the first
  // one, an MLP, can finish in the 300 ms before it: its watch then ends
  // OK, as it should).
  grpc::ClientContext watch_context;
  watch_context.set_deadline(In(120000));
  std::atomic<int> watch_code{-1};
  std::thread watcher([&] {
    auto stub = v1::Planner::NewStub(channel);
    v1::WatchJobRequest request;
    request.set_job_id(acknowledged.back());
    auto reader = stub->WatchJob(&watch_context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
    }
    watch_code = reader->Finish().error_code();
  });
  // Lease polls of a CUDA worker that nothing here can satisfy (the jobs
  // ask for CPU), so they stay open until the server stops.
  auto hub = v1::WorkerHub::NewStub(channel);
  std::string cuda_worker;
  {
    grpc::ClientContext context;
    context.set_deadline(In(5000));
    v1::RegisterWorkerRequest request;
    request.mutable_worker()->mutable_device()->set_kind("cuda");
    request.mutable_worker()->mutable_device()->set_name("fake");
    v1::RegisterWorkerResponse response;
    ASSERT_TRUE(hub->RegisterWorker(&context, request, &response).ok());
    cuda_worker = response.worker_id();
  }
  constexpr int kPolls = 20;
  std::atomic<int> polls_answered{0};
  std::vector<std::thread> pollers;
  for (int i = 0; i < kPolls; ++i) {
    pollers.emplace_back([&] {
      grpc::ClientContext context;
      context.set_deadline(In(120000));
      v1::LeaseTaskRequest request;
      request.set_worker_id(cuda_worker);
      request.set_wait_ms(30000);
      v1::LeaseTaskResponse response;
      const grpc::Status s = hub->LeaseTask(&context, request, &response);
      if (s.ok() || s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        ++polls_answered;
      }
    });
  }

  // Work in flight: the worker runs a task.
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    for (const std::string& id : acknowledged) {
      auto job = GetJob(id);
      // PROFILING: a profile task is leased to the worker and runs.
      running |= job.ok() && job->state() == v1::Job::PROFILING;
    }
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(running) << "no task ever ran";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  const auto sigterm_at = std::chrono::steady_clock::now();
  server_->Kill(SIGTERM);
  const int exit_code = server_->Wait(std::chrono::seconds(30));
  const double exit_s = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - sigterm_at)
                            .count();
  EXPECT_EQ(exit_code, 0) << "not exited (or failed) 30 s after SIGTERM";
  EXPECT_LT(exit_s, 30);
  // The open polls and the watch are answered at shutdown, not held until
  // the drain timeout (10 s) cancels them.
  EXPECT_LT(exit_s, 5) << "the drain waited for the open polls and watch";
  watcher.join();
  for (std::thread& t : pollers) t.join();
  // Answered (UNAVAILABLE: watch again elsewhere), not cut off.
  EXPECT_EQ(watch_code.load(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(polls_answered.load(), kPolls);

  // Restart on the same data dir: every acknowledged job is there and goes
  // final once the (same, still running) worker reaches the server again.
  RestartServer();
  int lost = 0;
  for (const std::string& id : acknowledged) {
    if (!GetJob(id).ok()) ++lost;
  }
  EXPECT_EQ(lost, 0) << "acknowledged jobs lost";
  int final_jobs = 0, succeeded = 0;
  const auto restart_at = std::chrono::steady_clock::now();
  for (const std::string& id : acknowledged) {
    for (int i = 0; i < 1200; ++i) {
      auto job = GetJob(id);
      if (job.ok() && IsFinal(job->state())) {
        ++final_jobs;
        if (job->state() == v1::Job::SUCCEEDED) ++succeeded;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  const double final_s = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - restart_at)
                             .count();
  EXPECT_EQ(final_jobs, static_cast<int>(acknowledged.size()));
  EXPECT_EQ(succeeded, static_cast<int>(acknowledged.size()));
  std::cout << "{\"jobs\": " << acknowledged.size()
            << ", \"open_polls\": " << kPolls
            << ", \"sigterm_exit_s\": " << exit_s
            << ", \"exit_code\": " << exit_code << ", \"lost\": " << lost
            << ", \"final_after_restart\": " << final_jobs
            << ", \"succeeded\": " << succeeded
            << ", \"all_final_s\": " << final_s << "}\n";
}

}  // namespace
}  // namespace mutwo
