// Long waits without threads: LeaseTask polls and WatchJob
// streams on the callback API, against an in-process MutwoServer on
// loopback. Open polls and watches must not slow the other RPCs down even
// with few sync threads; past --max_lease_waiters / --max_watchers the server
// answers RESOURCE_EXHAUSTED with a retry hint; a poll whose client cancels
// frees its place at once.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/job_watch.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "server/job_core.h"
#include "server/server.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/process.h"
#include "tests/testing/server_fixture.h"
#include "worker/daemon/daemon.h"

namespace mutwo {
namespace {

namespace fs = std::filesystem;

// Threads of this process (server and client together), from /proc.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

using testing::In;

class LongWaitTest : public testing::InProcessServerTest {
 protected:
  LongWaitTest() : InProcessServerTest("long_wait") {}

  void StartServer(int max_rpc_threads, int max_lease_waiters, int max_watchers,
                   int64_t retry_after_ms = 1500,
                   const std::string& metrics_listen = "") {
    MutwoServer::Options options = ServerOptions();
    options.metrics_listen = metrics_listen;
    options.max_rpc_threads = max_rpc_threads;
    options.core.max_lease_waiters = max_lease_waiters;
    options.core.max_watchers = max_watchers;
    options.core.waiter_retry_after_ms = retry_after_ms;
    InProcessServerTest::StartServer(std::move(options));
    if (server_ == nullptr) return;
    channel_ =
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    planner_ = v1::Planner::NewStub(channel_);
    hub_ = v1::WorkerHub::NewStub(channel_);
  }

  // A job no CPU worker can run (it asks for CUDA), so it stays open and
  // the polls of CPU workers stay empty.
  std::string SubmitCudaJob() {
    const std::string model = testing::UncheckedModelArchive("model bytes");
    EXPECT_TRUE(testing::UploadModel(*planner_, model).ok());
    std::string job_id;
    grpc::Status s = testing::SubmitJob(
        *planner_, testing::ChainJobRequest(model, "cuda"), &job_id);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job_id;
  }

  std::string RegisterCpuWorker() {
    std::string worker_id;
    EXPECT_TRUE(testing::RegisterCpuWorker(*hub_, "", &worker_id).ok());
    return worker_id;
  }

  // Open calls that the test cancels at its end.
  struct OpenPoll {
    grpc::ClientContext context;
    v1::LeaseTaskResponse response;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::LeaseTaskResponse>>
        call;
    grpc::Status status;
  };
  struct OpenWatch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReader<v1::JobEvent>> call;
  };

  void OpenPolls(int n, const std::string& worker_id) {
    for (int i = 0; i < n; ++i) {
      auto poll = std::make_unique<OpenPoll>();
      poll->context.set_deadline(In(60000));
      v1::LeaseTaskRequest request;
      request.set_worker_id(worker_id);
      request.set_wait_ms(30000);
      poll->call = hub_->AsyncLeaseTask(&poll->context, request, &cq_);
      poll->call->Finish(&poll->response, &poll->status, poll.get());
      polls_.push_back(std::move(poll));
    }
  }
  void OpenWatches(int n, const std::string& job_id) {
    for (int i = 0; i < n; ++i) {
      auto watch = std::make_unique<OpenWatch>();
      watch->context.set_deadline(In(60000));
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      watch->call =
          planner_->AsyncWatchJob(&watch->context, request, &cq_, watch.get());
      watches_.push_back(std::move(watch));
    }
  }
  void CancelAll() {
    for (auto& p : polls_) p->context.TryCancel();
    for (auto& w : watches_) w->context.TryCancel();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    polls_.clear();
    watches_.clear();
  }

  grpc::Status Lease(const std::string& worker_id, int wait_ms,
                     grpc::ClientContext& context) {
    context.set_deadline(In(wait_ms + 10000));
    v1::LeaseTaskRequest request;
    request.set_worker_id(worker_id);
    request.set_wait_ms(wait_ms);
    v1::LeaseTaskResponse response;
    return hub_->LeaseTask(&context, request, &response);
  }

  static std::string Trailer(const grpc::ClientContext& context,
                             const std::string& key) {
    auto it = context.GetServerTrailingMetadata().find(key);
    if (it == context.GetServerTrailingMetadata().end()) return "";
    return std::string(it->second.data(), it->second.size());
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Planner::Stub> planner_;
  std::unique_ptr<v1::WorkerHub::Stub> hub_;
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<OpenPoll>> polls_;
  std::vector<std::unique_ptr<OpenWatch>> watches_;
};

// 100 lease polls and 100 watches open on a server with 4 sync threads:
// GetJob still answers, each within 200 ms (with a thread per wait it
// could not be served at all until a poll ended).
TEST_F(LongWaitTest, OpenPollsAndWatchesDoNotBlockOtherRpcs) {
  StartServer(/*max_rpc_threads=*/4, 1000, 1000);
  const std::string job_id = SubmitCudaJob();
  const std::string worker_id = RegisterCpuWorker();
  const int threads_before = ThreadCount();
  OpenPolls(100, worker_id);
  OpenWatches(100, job_id);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // No thread per wait: 200 open waits add (almost) none.
  const int threads_waiting = ThreadCount();
  EXPECT_LT(threads_waiting - threads_before, 20)
      << threads_before << " threads before, " << threads_waiting
      << " with 200 waits open";
  double worst_ms = 0;
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.set_deadline(In(5000));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    const auto start = std::chrono::steady_clock::now();
    grpc::Status s = planner_->GetJob(&context, request, &job);
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
    worst_ms = std::max(worst_ms, ms);
  }
  std::cout << "{\"open_polls\": 100, \"open_watches\": 100, "
            << "\"sync_threads\": 4, \"getjob_worst_ms\": " << worst_ms
            << ", \"threads_before\": " << threads_before
            << ", \"threads_with_waits\": " << threads_waiting << "}\n";
  EXPECT_LT(worst_ms, 200);
  CancelAll();
}

// One past the limit is refused at once with RESOURCE_EXHAUSTED, a message
// saying when to retry and grpc-retry-pushback-ms in the trailers.
TEST_F(LongWaitTest, WaiterBeyondTheLimitIsRefusedWithARetryHint) {
  StartServer(0, /*max_lease_waiters=*/3, /*max_watchers=*/2);
  const std::string job_id = SubmitCudaJob();
  const std::string worker_id = RegisterCpuWorker();
  OpenPolls(3, worker_id);
  OpenWatches(2, job_id);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  grpc::ClientContext lease_context;
  const auto start = std::chrono::steady_clock::now();
  grpc::Status refused = Lease(worker_id, 30000, lease_context);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("--max_lease_waiters"),
            std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("retry in 1500 ms"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Trailer(lease_context, "grpc-retry-pushback-ms"), "1500");

  grpc::ClientContext watch_context;
  watch_context.set_deadline(In(10000));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = planner_->WatchJob(&watch_context, request);
  v1::JobEvent event;
  EXPECT_FALSE(reader->Read(&event));
  grpc::Status watch_refused = reader->Finish();
  EXPECT_EQ(watch_refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << watch_refused.error_message();
  EXPECT_NE(watch_refused.error_message().find("--max_watchers"),
            std::string::npos);
  EXPECT_EQ(Trailer(watch_context, "grpc-retry-pushback-ms"), "1500");
  CancelAll();
}

// A poll whose client cancels leaves at once: with a limit of one poll, the
// next poll is admitted right after the first one's client cancelled.
TEST_F(LongWaitTest, CancelledPollFreesItsPlaceAtOnce) {
  StartServer(0, /*max_lease_waiters=*/1, 10);
  const std::string worker_id = RegisterCpuWorker();
  OpenPolls(1, worker_id);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  {
    grpc::ClientContext context;
    EXPECT_EQ(Lease(worker_id, 0, context).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  polls_[0]->context.TryCancel();
  void* tag;
  bool ok;
  ASSERT_TRUE(cq_.Next(&tag, &ok));
  EXPECT_EQ(polls_[0]->status.error_code(), grpc::StatusCode::CANCELLED);
  const auto cancelled_at = std::chrono::steady_clock::now();
  // Admitted within 200 ms of the cancel (a poll of 0 ms answers empty).
  grpc::Status admitted;
  while (std::chrono::steady_clock::now() - cancelled_at <
         std::chrono::milliseconds(200)) {
    grpc::ClientContext context;
    admitted = Lease(worker_id, 0, context);
    if (admitted.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(admitted.ok()) << admitted.error_message();
  CancelAll();
}

// The CLI's watch (mutwo watch, submit --wait) refused for too many watches
// comes back after the server's hint instead of failing.
TEST_F(LongWaitTest, CliWatchComesBackAfterTheRetryHint) {
  StartServer(0, 10, /*max_watchers=*/1);
  const std::string job_id = SubmitCudaJob();
  OpenWatches(1, job_id);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::ostringstream progress;
  absl::StatusOr<v1::Job> followed;
  std::thread follower([&] {
    followed = FollowJob(*planner_, job_id, 0, /*timeout_s=*/30, progress);
  });
  // Refused now (the one watch allowed is open); the hint is 1500 ms.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CancelAll();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  {
    grpc::ClientContext context;
    context.set_deadline(In(5000));
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    ASSERT_TRUE(planner_->CancelJob(&context, request, &job).ok());
  }
  follower.join();
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_EQ(followed->state(), v1::Job::CANCELLED);
}

// The worker daemon refused for too many polls waits the server's hint (3 s
// here) before it polls again, instead of its own backoff (100-200 ms, then
// doubling: 5 tries in 4 s).
TEST_F(LongWaitTest, WorkerDaemonWaitsTheRetryHint) {
  StartServer(0, /*max_lease_waiters=*/1, 10, /*retry_after_ms=*/3000,
              "127.0.0.1:0");
  OpenPolls(1, RegisterCpuWorker());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  WorkerDaemon::Options options;
  options.server = absl::StrCat("127.0.0.1:", server_->port());
  options.work_dir = (dir_ / "worker").string();
  options.self_executable = "/bin/false";  // never runs: nothing is leased
  options.probe_device = [] {
    v1::DeviceInfo device;
    device.set_kind("cpu");
    device.set_name("cpu");
    return absl::StatusOr<v1::DeviceInfo>(device);
  };
  auto daemon = WorkerDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::thread run([&] { (void)(*daemon)->Run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  (*daemon)->Shutdown();
  run.join();
  const std::string body =
      testing::HttpGet(server_->metrics_port(), "/metrics");
  const std::string series = "mutwo_long_waits_refused_total{kind=\"lease\"} ";
  const size_t at = body.find(series);
  ASSERT_NE(at, std::string::npos) << body;
  const int refused = std::stoi(body.substr(at + series.size()));
  std::cout << "{\"daemon_refused_polls_in_4s\": " << refused << "}\n";
  EXPECT_GE(refused, 1);
  EXPECT_LE(refused, 2);
  CancelAll();
}

}  // namespace
}  // namespace mutwo
