// Report-path planning is bounded and off the RPC threads: a profile
// report plans the knee and every budget of its job. Each
// test is the attack, against an in-process MutwoServer on loopback:
//   - a worker reports a dense 4,096-node profile for a job with 32 budgets
//     (the report took 29.2 s, and a GetJob waited 6.8 s): its
//     planning is cut at --max_report_plan_ms, the result names the limit,
//     and GetJob calls timed meanwhile stay under 100 ms;
//   - the server drains (what SIGTERM runs) with that planning in flight:
//     it ends within the drain limit, the report is answered UNAVAILABLE
//     and nothing of it is stored;
//   - the worker's call ends while its report is planned: planning stops,
//     nothing is stored, the worker's next report of the task is taken;
//   - more reports than --planning_threads + --max_queued_reports: the
//     extra one is refused at once, naming both flags.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "server/profile_limits.h"
#include "server/server.h"
#include "storage/store.h"
#include "tests/testing/adversarial_profile.h"
#include "tests/testing/grpc_calls.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/server_fixture.h"

namespace mutwo {
namespace {

using testing::In;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
      .count();
}

// A memory figure of this process (the in-process server and this test's
// client) from /proc/self/status, e.g. "VmHWM" (the peak) or "VmRSS", in MiB.
double StatusMiB(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, key + ":")) {
      return std::stod(line.substr(key.size() + 1)) / 1024.0;
    }
  }
  return 0;
}
double PeakRssMiB() { return StatusMiB("VmHWM"); }
double RssMiB() { return StatusMiB("VmRSS"); }

// The dense profile of planner_test's BoundedPlanningTest, measured on a
// CPU with a LibTorch version (what the schedule cache key needs).
v1::Profile Dense(int activations, int fan_in, int64_t batch_size) {
  v1::Profile p =
      testing::DenseRecomputeProfile(activations, fan_in, batch_size);
  p.mutable_device()->set_kind("cpu");
  p.mutable_device()->set_name("cpu");
  p.mutable_device()->set_libtorch_version("1.13.0");
  return p;
}

class ReportPlanningTest : public testing::InProcessServerTest {
 protected:
  ReportPlanningTest() : InProcessServerTest("report_planning") {}

  // Limits raised so that the dense profile is taken: its planning, not
  // ingest, is what is bounded here.
  MutwoServer::Options Options(int64_t max_report_plan_ms) {
    MutwoServer::Options options = ServerOptions();
    options.core.profile_limits.max_nodes = 1 << 16;
    options.core.profile_limits.max_edges = int64_t{1} << 22;
    options.core.max_report_plan_ms = max_report_plan_ms;
    // The time limit, not the job's size, is what cuts these reports.
    options.core.max_job_result_bytes = int64_t{64} << 20;
    options.max_rpc_threads = 8;
    return options;
  }

  std::unique_ptr<v1::Planner::Stub> Planner() {
    return v1::Planner::NewStub(NewChannel(""));
  }
  std::unique_ptr<v1::WorkerHub::Stub> Hub() {
    return v1::WorkerHub::NewStub(NewChannel(""));
  }

  // A CPU job of the model `tag` (testing::UncheckedModelArchive) with 32
  // budgets (30% to 92% of the baseline).
  std::string SubmitJob(const std::string& tag) {
    const std::string model = testing::UncheckedModelArchive(tag);
    auto planner = Planner();
    EXPECT_TRUE(testing::UploadModel(*planner, model).ok());
    v1::SubmitJobRequest r = testing::ChainJobRequest(model, "cpu");
    r.mutable_spec()->clear_budgets();
    for (int percent = 30; percent < 94; percent += 2) {
      *r.mutable_spec()->add_budgets() =
          *ParseBudget(absl::StrCat(percent, "%"));
    }
    std::string job_id;
    grpc::Status s = testing::SubmitJob(*planner, r, &job_id);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job_id;
  }

  v1::Task Lease(const std::string& worker_id) {
    grpc::ClientContext context;
    context.set_deadline(In(10000));
    v1::LeaseTaskRequest request;
    request.set_worker_id(worker_id);
    request.set_wait_ms(2000);
    v1::LeaseTaskResponse response;
    grpc::Status s = Hub()->LeaseTask(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.task();
  }

  grpc::Status Report(const std::string& worker_id, const v1::Task& task,
                      const v1::Profile& profile, int deadline_ms = 120000,
                      std::string* retry_pushback_ms = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(In(deadline_ms));
    v1::ReportProfileRequest request;
    request.set_worker_id(worker_id);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    *request.mutable_profile() = profile;
    v1::ReportResponse response;
    grpc::Status s = Hub()->ReportProfile(&context, request, &response);
    if (retry_pushback_ms != nullptr) {
      auto hint =
          context.GetServerTrailingMetadata().find("grpc-retry-pushback-ms");
      if (hint != context.GetServerTrailingMetadata().end()) {
        *retry_pushback_ms =
            std::string(hint->second.data(), hint->second.size());
      }
    }
    return s;
  }

  absl::StatusOr<v1::Job> GetJob(v1::Planner::Stub& planner,
                                 const std::string& job_id) {
    grpc::ClientContext context;
    context.set_deadline(In(10000));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::Status s = planner.GetJob(&context, request, &job);
    if (!s.ok()) return absl::UnknownError(s.error_message());
    return job;
  }

  void DrainDuringPlanning(int nodes);

  // Starts the server with `options`, submits the 32-budget job, reports
  // `profile` (batch size 8) for its task and reads the job back into
  // `*job`, which has one result.
  void ReportDense(MutwoServer::Options options, const v1::Profile& profile,
                   v1::Job* job) {
    StartServer(std::move(options));
    const std::string job_id = SubmitJob("dense model");
    const std::string worker = RegisterWorker();
    const v1::Task task = Lease(worker);
    ASSERT_EQ(task.batch_size(), profile.batch_size());
    grpc::Status s = Report(worker, task, profile);
    ASSERT_TRUE(s.ok()) << s.error_message();
    auto planner = Planner();
    auto read = GetJob(*planner, job_id);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->results_size(), 1);
    *job = *std::move(read);
  }

  std::string RegisterWorker() {
    std::string worker_id;
    EXPECT_TRUE(testing::RegisterCpuWorker(*Hub(), "", &worker_id).ok());
    return worker_id;
  }
};

TEST_F(ReportPlanningTest, LargeReportIsCutAtItsLimitWhileGetJobStaysFast) {
  constexpr int64_t kLimitMs = 3000;
  StartServer(Options(kLimitMs));
  const std::string job_id = SubmitJob("dense model");
  const std::string worker = RegisterWorker();
  const v1::Task task = Lease(worker);
  ASSERT_EQ(task.job_id(), job_id);
  const v1::Profile profile = Dense(4096, 32, task.batch_size());

  const auto start = Clock::now();
  grpc::Status reported;
  double report_ms = 0;
  std::atomic<bool> done{false};
  std::thread reporter([&] {
    reported = Report(worker, task, profile);
    report_ms = MsSince(start);
    done = true;
  });
  auto planner = Planner();
  std::vector<double> get_job_ms;
  while (!done) {
    const auto t = Clock::now();
    auto job = GetJob(*planner, job_id);
    get_job_ms.push_back(MsSince(t));
    EXPECT_TRUE(job.ok()) << job.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reporter.join();
  ASSERT_TRUE(reported.ok()) << reported.error_message();
  EXPECT_LT(report_ms, kLimitMs + 3000);
  std::sort(get_job_ms.begin(), get_job_ms.end());
  ASSERT_GE(get_job_ms.size(), 20u);
  const double p99 = get_job_ms[get_job_ms.size() * 99 / 100];
  EXPECT_LT(p99, 100.0);

  auto job = GetJob(*planner, job_id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->results_size(), 1);
  const std::string& error = job->results(0).error();
  EXPECT_TRUE(absl::StrContains(error, "--max_report_plan_ms")) << error;
  std::cout << "{\"test\":\"report_planning_cut\",\"nodes\":4096,"
            << "\"budgets\":32,\"limit_ms\":" << kLimitMs
            << ",\"report_ms\":" << report_ms
            << ",\"schedules_planned\":" << job->results(0).schedules_size()
            << ",\"get_job_calls\":" << get_job_ms.size()
            << ",\"get_job_p99_ms\":" << p99
            << ",\"get_job_max_ms\":" << get_job_ms.back()
            << ",\"process_peak_rss_mib\":" << PeakRssMiB() << "}\n";
}

// The bar: a dense 16,384-node report (32 recompute sources each,
// 4.7 MB) for a job with 32 budgets, with the ingest limits raised so that
// it is planned, not refused (the issue: 162.7 s, 6,256 MiB, the next
// GetJob missed its 10 s deadline). At the default --max_report_plan_ms
// and memory limits: the process stays under 1 GiB, GetJob's p99 under
// 100 ms while it runs, and the report is cut at a limit its result names.
TEST_F(ReportPlanningTest, SixteenThousandNodeReportStaysUnderOneGiB) {
  MutwoServer::Options options = Options(JobCore::Options().max_report_plan_ms);
  options.core.max_job_result_bytes = JobCore::Options().max_job_result_bytes;
  StartServer(std::move(options));
  const std::string job_id = SubmitJob("dense model 16k");
  const std::string worker = RegisterWorker();
  const v1::Task task = Lease(worker);
  ASSERT_EQ(task.job_id(), job_id);
  v1::Profile profile = Dense(16384, 32, task.batch_size());
  const double rss_before = RssMiB();

  const auto start = Clock::now();
  grpc::Status reported;
  double report_ms = 0;
  std::atomic<bool> done{false};
  std::thread reporter([&] {
    reported = Report(worker, task, profile, 600000);
    report_ms = MsSince(start);
    done = true;
  });
  // Receives up to 64 MiB, as the mutwo CLI and Python client do.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto planner = v1::Planner::NewStub(grpc::CreateCustomChannel(
      address_, grpc::InsecureChannelCredentials(), args));
  std::vector<double> get_job_ms;
  double rss_max = rss_before;
  while (!done) {
    const auto t = Clock::now();
    auto job = GetJob(*planner, job_id);
    get_job_ms.push_back(MsSince(t));
    EXPECT_TRUE(job.ok()) << job.status();
    rss_max = std::max(rss_max, RssMiB());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reporter.join();
  ASSERT_TRUE(reported.ok()) << reported.error_message();
  std::sort(get_job_ms.begin(), get_job_ms.end());
  ASSERT_GE(get_job_ms.size(), 20u);
  const double p99 = get_job_ms[get_job_ms.size() * 99 / 100];
  EXPECT_LT(p99, 100.0);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's shadow memory and quarantine (256 MiB) are not the
  // server's: the bar is checked in builds without it (the process held
  // 459 MiB under ASan before the report began).
  std::cout << "AddressSanitizer build: the 1 GiB bar is not checked\n";
#else
  EXPECT_LT(rss_max, 1024.0);
  EXPECT_LT(PeakRssMiB(), 1024.0);
#endif
  auto job = GetJob(*planner, job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->results_size(), 1);
  const v1::BatchResult& result = job->results(0);
  // Cut (not all 32 budgets planned) at a limit the result names.
  EXPECT_LT(result.schedules_size(), 32);
  EXPECT_TRUE(absl::StrContains(result.error(), "cut: the")) << result.error();
  EXPECT_LE(job->ByteSizeLong(),
            JobCore::Options().max_job_result_bytes + (size_t{1} << 20));
  std::cout << "{\"test\":\"report_planning_16k\",\"nodes\":16384,"
            << "\"budgets\":32,\"profile_bytes\":" << profile.ByteSizeLong()
            << ",\"job_bytes\":" << job->ByteSizeLong()
            << ",\"report_ms\":" << report_ms
            << ",\"schedules_planned\":" << result.schedules_size()
            << ",\"error\":\"" << result.error().substr(0, 400) << "\""
            << ",\"get_job_calls\":" << get_job_ms.size()
            << ",\"get_job_p99_ms\":" << p99
            << ",\"get_job_max_ms\":" << get_job_ms.back()
            << ",\"rss_before_mib\":" << rss_before
            << ",\"rss_max_mib\":" << rss_max
            << ",\"process_peak_rss_mib\":" << PeakRssMiB() << "}\n";
}

// The memory budgets: a profile whose one plan needs more than
// --max_report_plan_bytes is refused at once naming it; a report whose kept
// schedules would pass it is cut naming it; a job whose results would pass
// --max_job_result_bytes is cut naming that. A dense 4,096-node profile, 32
// budgets.
TEST_F(ReportPlanningTest, ProfileOverThePlanningMemoryLimitIsRefused) {
  MutwoServer::Options options = Options(/*max_report_plan_ms=*/120000);
  options.core.profile_limits.max_report_plan_bytes = int64_t{16} << 20;
  StartServer(std::move(options));
  SubmitJob("dense model");
  const std::string worker = RegisterWorker();
  const v1::Task task = Lease(worker);
  const v1::Profile profile = Dense(4096, 32, task.batch_size());
  ASSERT_GT(PlanningWorkingBytes(profile), int64_t{16} << 20);
  const auto start = Clock::now();
  grpc::Status s = Report(worker, task, profile);
  const double ms = MsSince(start);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "--max_report_plan_bytes"))
      << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "16.00 MiB"))
      << s.error_message();
  EXPECT_LT(ms, 2000);
  std::cout << "{\"test\":\"report_memory_refused\",\"working_bytes\":"
            << PlanningWorkingBytes(profile) << ",\"refused_ms\":" << ms
            << ",\"message\":\"" << s.error_message() << "\"}\n";
}

TEST_F(ReportPlanningTest, ReportIsCutAtItsMemoryLimit) {
  const v1::Profile profile = Dense(4096, 32, 8);
  // Room for the planner and about three schedules with their cache
  // entries (~2.6 MiB each in memory).
  const int64_t limit = PlanningWorkingBytes(profile) + (int64_t{8} << 20);
  MutwoServer::Options options = Options(/*max_report_plan_ms=*/120000);
  options.core.profile_limits.max_report_plan_bytes = limit;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(ReportDense(std::move(options), profile, &job));
  const v1::BatchResult& result = job.results(0);
  EXPECT_GE(result.schedules_size(), 1);
  EXPECT_LT(result.schedules_size(), 8);
  EXPECT_TRUE(absl::StrContains(result.error(),
                                "cut: the report's planning reached its memory "
                                "limit (--max_report_plan_bytes"))
      << result.error();
  std::cout << "{\"test\":\"report_memory_cut\",\"limit_bytes\":" << limit
            << ",\"schedules_planned\":" << result.schedules_size()
            << ",\"error\":\"" << result.error() << "\"}\n";
}

TEST_F(ReportPlanningTest, JobResultsAreCutAtTheirSizeLimit) {
  MutwoServer::Options options = Options(/*max_report_plan_ms=*/120000);
  options.core.max_job_result_bytes = int64_t{1} << 20;
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(
      ReportDense(std::move(options), Dense(4096, 32, 8), &job));
  const v1::BatchResult& result = job.results(0);
  EXPECT_GE(result.schedules_size(), 1);
  EXPECT_LT(result.schedules_size(), 8);
  EXPECT_LE(result.ByteSizeLong(), size_t{1} << 20);
  EXPECT_TRUE(absl::StrContains(result.error(),
                                "(--max_job_result_bytes, "
                                "1.00 MiB)"))
      << result.error();
  std::cout << "{\"test\":\"job_result_cut\",\"job_bytes\":"
            << job.ByteSizeLong()
            << ",\"schedules_planned\":" << result.schedules_size()
            << ",\"error\":\"" << result.error() << "\"}\n";
}

// The server drains (what SIGTERM runs, with a 2 s limit) while a dense
// profile of `nodes` nodes is planned.
void ReportPlanningTest::DrainDuringPlanning(int nodes) {
  StartServer(Options(/*max_report_plan_ms=*/120000));
  const std::string job_id = SubmitJob("dense model");
  const std::string worker = RegisterWorker();
  const v1::Task task = Lease(worker);
  ASSERT_EQ(task.job_id(), job_id);
  const v1::Profile profile = Dense(nodes, 32, task.batch_size());
  grpc::Status reported;
  std::thread reporter([&] { reported = Report(worker, task, profile); });
  // Planning has begun once the job shows PLANNING.
  auto planner = Planner();
  const auto wait = Clock::now();
  for (;;) {
    auto job = GetJob(*planner, job_id);
    ASSERT_TRUE(job.ok());
    if (job->state() == v1::Job::PLANNING) break;
    ASSERT_LT(MsSince(wait), 20000) << "planning never began";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  constexpr int kDrainMs = 2000;
  const auto start = Clock::now();
  server_->Shutdown(absl::Milliseconds(kDrainMs));
  const double shutdown_ms = MsSince(start);
  reporter.join();
  EXPECT_LT(shutdown_ms, kDrainMs + 500);
  EXPECT_EQ(reported.error_code(), grpc::StatusCode::UNAVAILABLE)
      << reported.error_message();
  EXPECT_TRUE(absl::StrContains(reported.error_message(), "shutting down"))
      << reported.error_message();
  // Nothing of the report stored: the task is reported again to the next
  // server (or leased again).
  storage::Store::Options store_options;
  store_options.data_dir = ServerOptions().data_dir;
  auto store = storage::Store::Open(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(absl::IsNotFound(
      (*store)->GetProfile(job_id, task.batch_size()).status()));
  std::cout << "{\"test\":\"drain_during_planning\",\"nodes\":" << nodes
            << ",\"drain_limit_ms\":" << kDrainMs
            << ",\"shutdown_ms\":" << shutdown_ms
            << ",\"report_code\":" << reported.error_code() << "}\n";
}

TEST_F(ReportPlanningTest, DrainDuringPlanningEndsWithinTheLimit) {
  DrainDuringPlanning(4096);
}

// The 16,384-node report (SIGTERM exited after 17.3 s against a
// 10 s drain limit).
TEST_F(ReportPlanningTest, DrainDuring16kPlanningEndsWithinTheLimit) {
  DrainDuringPlanning(16384);
}

// The worker's call ends (its deadline passes) while its report is being
// planned: the planning stops, nothing is stored, the job shows PROFILING
// again and the task, still the worker's, takes its next report.
TEST_F(ReportPlanningTest, WorkerLeavingStopsItsPlanning) {
  MutwoServer::Options options = Options(/*max_report_plan_ms=*/120000);
  options.planning_threads = 1;
  options.max_queued_reports = 0;  // a busy thread refuses the next report
  StartServer(std::move(options));
  const std::string job_id = SubmitJob("dense model");
  const std::string worker = RegisterWorker();
  const v1::Task task = Lease(worker);
  const auto start = Clock::now();
  grpc::Status left =
      Report(worker, task, Dense(4096, 32, task.batch_size()), 1500);
  EXPECT_EQ(left.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  auto planner = Planner();
  double stopped_ms = 0;
  for (;;) {
    auto job = GetJob(*planner, job_id);
    ASSERT_TRUE(job.ok());
    if (job->state() == v1::Job::PROFILING) {
      stopped_ms = MsSince(start);
      break;
    }
    ASSERT_LT(MsSince(start), 10000) << "planning went on after the call";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The one planning thread is free again (a busy one refuses at once, and
  // the dense plans left would hold it ~15 s more) and nothing was stored:
  // the worker's next report of the task is taken.
  const auto again = Clock::now();
  grpc::Status s;
  do {
    s = Report(worker, task, Dense(64, 4, task.batch_size()));
  } while (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
           MsSince(again) < 1000);
  EXPECT_TRUE(s.ok()) << s.error_message();
  const double again_ms = MsSince(again);
  std::cout << "{\"test\":\"worker_left_during_planning\","
            << "\"call_deadline_ms\":1500,\"job_profiling_again_ms\":"
            << stopped_ms << ",\"next_report_ms\":" << again_ms << "}\n";
}

TEST_F(ReportPlanningTest, FullPlanningPoolRefusesAtOnceNamingTheFlags) {
  MutwoServer::Options options = Options(/*max_report_plan_ms=*/120000);
  options.planning_threads = 1;
  options.max_queued_reports = 0;
  StartServer(std::move(options));
  const std::string first = SubmitJob("dense model 1");
  const std::string second = SubmitJob("dense model 2");
  const std::string worker = RegisterWorker();
  const v1::Task a = Lease(worker);
  const v1::Task b = Lease(worker);
  ASSERT_NE(a.task_id(), b.task_id());
  grpc::Status first_report;
  std::thread reporter([&] {
    first_report = Report(worker, a, Dense(4096, 32, a.batch_size()));
  });
  auto planner = Planner();
  const auto wait = Clock::now();
  for (;;) {
    auto job = GetJob(*planner, a.job_id());
    ASSERT_TRUE(job.ok());
    if (job->state() == v1::Job::PLANNING) break;
    ASSERT_LT(MsSince(wait), 20000) << "planning never began";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto start = Clock::now();
  std::string retry_hint;
  grpc::Status refused =
      Report(worker, b, Dense(64, 4, b.batch_size()), 120000, &retry_hint);
  const double refused_ms = MsSince(start);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // When to report again, which the worker daemon waits for before it
  // reports the profile again (else the profile is lost and the task waits
  // for its lease to expire).
  EXPECT_EQ(retry_hint, "1000");
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "--planning_threads"))
      << refused.error_message();
  EXPECT_TRUE(
      absl::StrContains(refused.error_message(), "--max_queued_reports"));
  EXPECT_LT(refused_ms, 1000);
  server_->Shutdown(absl::Seconds(2));
  reporter.join();
  std::cout << "{\"test\":\"planning_pool_full\",\"refused_ms\":" << refused_ms
            << "}\n";
}

}  // namespace
}  // namespace mutwo
