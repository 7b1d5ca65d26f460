// kill -9 of mutwo-server under concurrent writes. Each round
// starts the real server on the same data dir, runs client threads that
// submit jobs (each with its own request id, retried once) and a worker
// thread that leases tasks and reports profiles, validations and failures,
// then kills the server with SIGKILL at a random moment. After the last
// round the store must hold:
//   - `PRAGMA integrity_check` ok (checked after every kill),
//   - every job a client saw acknowledged,
//   - no job without tasks, no DONE task without its result, no DONE
//     PROFILE task without its profile,
//   - a retried submit of every acknowledged request id answered with the
//     whole job (deduplicated, all its tasks),
// and a restarted server with a worker must drive every job to a final
// state (none stuck non-final).
//
// MUTWO_CRASH_ROUNDS sets the number of kills (default 5: the short form;
// scripts/fault-suite.sh runs 100). Figures are printed as one JSON line.
#include <atomic>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "storage/sqlite.h"
#include "tests/testing/command.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/grpc_calls.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace mutwo {
namespace {

using testing::BinPath;
using testing::Subprocess;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? std::atoll(v) : fallback;
}

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

class CrashRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("crash_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Each start (the first and every restart after a kill) on ports found
  // free then: only the data dir has to survive a kill, and the clients of
  // a round connect through channel_, made anew for each start.
  void StartServer() {
    server_ = std::make_unique<Subprocess>();
    const auto ports = testing::StartOnFreePorts(
        *server_,
        [&](Subprocess& server, const testing::ServerPorts& p) {
          return server.Start(
              {BinPath("mutwo-server"), "--listen=" + p.address(),
               "--metrics_listen=", "--data_dir=" + (dir_ / "data").string(),
               "--lease_timeout_ms=1000", "--log_level=warn"},
              (dir_ / "server.log").string());
        },
        [&](const testing::ServerPorts& p) {
          channel_ = grpc::CreateChannel(p.address(),
                                         grpc::InsecureChannelCredentials());
          return channel_->WaitForConnected(In(250));
        });
    ASSERT_TRUE(ports.has_value())
        << "server did not start: " << server_->Log();
  }

  v1::SubmitJobRequest Request(const std::string& request_id) {
    v1::SubmitJobRequest r;
    r.set_client_request_id(request_id);
    auto* spec = r.mutable_spec();
    spec->set_model_sha256(sha_);
    spec->set_model_name("chain");
    *spec->add_inputs() = *ParseTensorSpec("x:float32[B,16]");
    spec->add_batch_sizes(2);
    spec->add_batch_sizes(4);
    *spec->add_budgets() = *ParseBudget("80%");
    return r;
  }

  void Upload() {
    auto stub = v1::Planner::NewStub(channel_);
    const std::string model =
        testing::UncheckedModelArchive("crash test model bytes");
    sha_ = Sha256Hex(model);
    const grpc::Status s =
        testing::UploadModel(*stub, model, /*out=*/nullptr, "chain");
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::filesystem::path dir_;
  std::unique_ptr<Subprocess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string sha_;
};

TEST_F(CrashRestartTest,
       KillNineUnderLoadLosesNothingAndLeavesNothingHalfDone) {
  const int rounds = static_cast<int>(EnvInt("MUTWO_CRASH_ROUNDS", 5));
  std::mt19937_64 rng(static_cast<uint64_t>(EnvInt("MUTWO_CRASH_SEED", 15)));
  absl::Mutex mu;
  std::map<std::string, std::string> acknowledged;  // request id -> job id
  int64_t submits = 0, integrity_ok = 0;
  for (int round = 0; round < rounds; ++round) {
    StartServer();
    if (round == 0) Upload();
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int c = 0; c < 4; ++c) {
      threads.emplace_back([&, c] {
        auto stub = v1::Planner::NewStub(channel_);
        // A few jobs per thread and round keep the final drain short.
        for (int i = 0; !stop && i < 8; ++i) {
          const std::string id = absl::StrCat("r", round, "-c", c, "-", i);
          v1::SubmitJobResponse response;
          const grpc::Status s =
              testing::SubmitJob(*stub, Request(id), &response, 2000);
          absl::MutexLock lock(&mu);
          ++submits;
          if (s.ok()) acknowledged[id] = response.job().job_id();
          std::this_thread::sleep_for(
              std::chrono::milliseconds(40 + (c * 7 + i * 13) % 60));
        }
      });
    }
    threads.emplace_back([&, round] {
      testing::RunFakeWorker(channel_, stop, round, /*fail_one_in=*/10);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 600));
    server_->Kill(SIGKILL);
    stop = true;
    for (std::thread& t : threads) t.join();
    auto db = storage::Db::Open((dir_ / "data" / "mutwo.db").string(), 5000);
    ASSERT_TRUE(db.ok());
    const std::string check = *(*db)->QueryText("PRAGMA integrity_check");
    EXPECT_EQ(check, "ok") << "after kill " << round + 1;
    if (check == "ok") ++integrity_ok;
  }

  // The store as the last kill left it.
  {
    auto db = storage::Db::Open((dir_ / "data" / "mutwo.db").string(), 5000);
    ASSERT_TRUE(db.ok());
    auto count = [&](const std::string& sql) {
      return (*db)->QueryInt(sql).value_or(-1);
    };
    EXPECT_EQ(count("SELECT COUNT(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 "
                    "FROM tasks t WHERE t.job_id = j.job_id)"),
              0)
        << "jobs without tasks (partial submits)";
    EXPECT_EQ(
        count(absl::StrCat(
            "SELECT COUNT(*) FROM tasks t WHERE t.state = ", v1::Task::DONE,
            " AND NOT EXISTS (SELECT 1 FROM task_results r WHERE "
            "r.task_id = t.task_id)")),
        0);
    EXPECT_EQ(count(absl::StrCat(
                  "SELECT COUNT(*) FROM tasks t WHERE t.state = ",
                  v1::Task::DONE, " AND t.kind = ", v1::Task::PROFILE,
                  " AND NOT EXISTS (SELECT 1 FROM profiles p WHERE p.job_id "
                  "= t.job_id AND p.batch_size = t.batch_size)")),
              0)
        << "DONE profile tasks without their profile";
  }

  // Restart: every acknowledged job is there, retried submits get the whole
  // job, and a worker drives every job to a final state.
  StartServer();
  auto stub = v1::Planner::NewStub(channel_);
  int64_t lost = 0, partial = 0;
  for (const auto& [id, job_id] : acknowledged) {
    v1::SubmitJobResponse again;
    ASSERT_TRUE(testing::SubmitJob(*stub, Request(id), &again, 5000).ok());
    if (!again.deduplicated() || again.job().job_id() != job_id) ++lost;
    if (again.job().tasks_total() < 2) ++partial;
  }
  EXPECT_EQ(lost, 0) << "acknowledged jobs lost";
  EXPECT_EQ(partial, 0) << "deduplicated answers with a partial job";
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      testing::RunFakeWorker(channel_, stop, 99 + w, /*fail_one_in=*/10);
    });
  }
  int64_t unfinished = -1;
  for (int i = 0; i < 1200 && unfinished != 0; ++i) {
    v1::ListJobsRequest list;
    for (auto s : {v1::Job::QUEUED, v1::Job::PROFILING, v1::Job::PLANNING,
                   v1::Job::VALIDATING}) {
      list.add_states(s);
    }
    list.set_page_size(1);
    v1::ListJobsResponse page;
    grpc::ClientContext ctx;
    ctx.set_deadline(In(5000));
    if (stub->ListJobs(&ctx, list, &page).ok()) unfinished = page.jobs_size();
    if (unfinished != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  stop = true;
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(unfinished, 0) << "jobs stuck non-final";
  std::cout << "{\"kills\": " << rounds << ", \"submits\": " << submits
            << ", \"acknowledged\": " << acknowledged.size()
            << ", \"lost\": " << lost << ", \"partial_dedup\": " << partial
            << ", \"integrity_ok\": " << integrity_ok
            << ", \"stuck_non_final\": " << unfinished << "}\n";
}

}  // namespace
}  // namespace mutwo
