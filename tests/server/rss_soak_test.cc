// The server's memory under a long run of reads: the real
// mutwo-server, jobs driven to SUCCEEDED by a fake worker, then rounds of
// the reads a dashboard or a training cluster repeats forever: GetSchedule
// answered from the schedule cache, GetJob and ListJobs. The server's
// resident set (VmRSS) after a warm-up and after the last round must differ
// by less than 100 MB.
//
// MUTWO_SOAK_ROUNDS sets the number of rounds (default 1,400: the short
// form; scripts/fault-suite.sh runs more). Figures are printed as one JSON
// line.
#include <atomic>
#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/grpc_calls.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace mutwo {
namespace {

using testing::HttpGet;
using testing::ResidentBytes;
using testing::Subprocess;

constexpr int kJobs = 60;  // more than one ListJobs page (50)
constexpr int kWarmupRounds = 200;
constexpr int64_t kMaxGrowthBytes = 100'000'000;  // the bar: 100 MB

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? std::atoll(v) : fallback;
}

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

double CacheHits(int metrics_port) {
  std::smatch m;
  const std::string body = HttpGet(metrics_port, "/metrics");
  static const std::regex re(
      "mutwo_schedule_cache_requests_total\\{result=\"hit\"\\} ([0-9.e+]+)");
  return std::regex_search(body, m, re) ? std::stod(m[1]) : -1.0;
}

class RssSoakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("rss_soak_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    server_ = std::make_unique<Subprocess>();
    const auto ports = testing::StartMutwoServerOnFreePorts(
        *server_, dir_, {"--log_level=warn"},
        [&](const testing::ServerPorts& p) {
          channel_ = grpc::CreateChannel(p.address(),
                                         grpc::InsecureChannelCredentials());
          return channel_->WaitForConnected(In(250));
        });
    ASSERT_TRUE(ports.has_value())
        << "server did not start: " << server_->Log();
    metrics_port_ = ports->metrics_port;
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << server_->Log();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string Upload() {
    auto stub = v1::Planner::NewStub(channel_);
    const std::string model =
        testing::UncheckedModelArchive("rss soak model bytes");
    const grpc::Status s =
        testing::UploadModel(*stub, model, /*out=*/nullptr, "chain");
    EXPECT_TRUE(s.ok()) << s.error_message();
    return Sha256Hex(model);
  }

  std::filesystem::path dir_;
  int metrics_port_ = 0;
  std::unique_ptr<Subprocess> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RssSoakTest, CachedReadsAndListingsDoNotGrowTheServer) {
  const int rounds = static_cast<int>(EnvInt("MUTWO_SOAK_ROUNDS", 1400));
  const std::string sha = Upload();
  auto stub = v1::Planner::NewStub(channel_);
  std::vector<std::string> job_ids;
  for (int i = 0; i < kJobs; ++i) {
    v1::SubmitJobRequest request;
    request.set_client_request_id(absl::StrCat("soak-", i));
    auto* spec = request.mutable_spec();
    spec->set_model_sha256(sha);
    spec->set_model_name("chain");
    *spec->add_inputs() = *ParseTensorSpec("x:float32[B,16]");
    spec->add_batch_sizes(2);
    *spec->add_budgets() = *ParseBudget("80%");
    grpc::ClientContext ctx;
    ctx.set_deadline(In(5000));
    v1::SubmitJobResponse response;
    const grpc::Status s = stub->SubmitJob(&ctx, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    job_ids.push_back(response.job().job_id());
  }
  // The fake worker profiles and validates every job.
  std::atomic<bool> stop{false};
  std::thread worker(
      [&] { testing::RunFakeWorker(channel_, stop, 1, /*fail_one_in=*/0); });
  auto state = [&](const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(5000));
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    EXPECT_TRUE(stub->GetJob(&ctx, request, &job).ok());
    return job.state();
  };
  for (const std::string& id : job_ids) {
    for (int i = 0; i < 600 && state(id) != v1::Job::SUCCEEDED; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  stop = true;
  worker.join();
  for (const std::string& id : job_ids) {
    ASSERT_EQ(state(id), v1::Job::SUCCEEDED) << id;
  }

  // One round: a cached schedule, a job, a page of jobs; every answer OK.
  int64_t failures = 0;
  auto round = [&](int r) {
    const std::string& id = job_ids[r % job_ids.size()];
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(In(5000));
      v1::GetScheduleRequest request;
      request.set_job_id(id);
      request.set_batch_size(2);
      *request.mutable_budget() = *ParseBudget("80%");
      v1::Schedule schedule;
      if (!stub->GetSchedule(&ctx, request, &schedule).ok()) ++failures;
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(In(5000));
      v1::GetJobRequest request;
      request.set_job_id(id);
      v1::Job job;
      if (!stub->GetJob(&ctx, request, &job).ok()) ++failures;
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(In(5000));
      v1::ListJobsRequest request;
      if (r % 2 == 1) request.set_page_size(10);
      v1::ListJobsResponse page;
      if (!stub->ListJobs(&ctx, request, &page).ok() || page.jobs().empty()) {
        ++failures;
      }
    }
  };
  for (int r = 0; r < kWarmupRounds; ++r) round(r);
  const int64_t rss_warm = ResidentBytes(server_->pid());
  const double hits_before = CacheHits(metrics_port_);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r) round(r);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const int64_t rss_end = ResidentBytes(server_->pid());
  const double hits = CacheHits(metrics_port_) - hits_before;
  std::cout << "{\"rounds\": " << rounds << ", \"rpcs\": " << 3 * rounds
            << ", \"seconds\": " << seconds
            << ", \"rss_after_warmup_bytes\": " << rss_warm
            << ", \"rss_end_bytes\": " << rss_end
            << ", \"rss_growth_bytes\": " << rss_end - rss_warm
            << ", \"schedule_cache_hits\": " << hits
            << ", \"failures\": " << failures << "}\n";
  EXPECT_EQ(failures, 0);
  // Every GetSchedule of the soak was a cache hit, not a fresh plan.
  EXPECT_EQ(hits, rounds);
  ASSERT_GT(rss_warm, 0);
  EXPECT_LT(rss_end - rss_warm, kMaxGrowthBytes)
      << "after warm-up " << rss_warm << " bytes, at the end " << rss_end;
}

}  // namespace
}  // namespace mutwo
