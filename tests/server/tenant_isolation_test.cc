// No tenant can starve another: each test is an attack by one principal
// (a client, a worker token) against an in-process MutwoServer on loopback
// with a tokens file, and checks that another principal is still served.
//   - one client opens more watches than its share: its own are refused past
//     --max_watchers_per_client, another client's watch still opens;
//   - one worker token opens more lease polls than its share: the same for
//     --max_lease_waiters_per_worker and another worker's poll;
//   - one client uploads random bytes past its stored-bytes quota: refused,
//     another client (with its own quota) still uploads; an upload that
//     sends a header and then nothing is dropped and its place freed;
//   - a rogue worker forges a profile for one tenant's job: another
//     tenant's job on the same model and spec is planned from its own
//     profile, never served the forged schedule from the cache; nor is the
//     same tenant's next job (entries are bound to the profile's digest and
//     the measuring worker), and the honest profile that disagrees with the
//     forged one is flagged (metric, stored flag);
//   - a profile measured by an admin-trusted worker is served across
//     tenants to jobs whose own profile agrees; once a rogue's profile of
//     the same key disagrees, nothing of that key is shared;
//   - a rogue worker fails every task it leases: after
//     --worker_quarantine_failures it leases nothing, an honest worker
//     takes the tasks;
//   - a worker reports a profile larger than the server plans (16,384 nodes,
//     or a dense 4,096-node one): refused at ingest naming the limit, before
//     anything is stored or planned, and its task failed naming it.
// Every refusal is RESOURCE_EXHAUSTED naming the principal and the flag,
// with a retry hint, and counted in mutwo_limit_refusals_total{limit}.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "server/auth/token_table.h"
#include "server/server.h"
#include "storage/store.h"
#include "tests/testing/adversarial_profile.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/process.h"
#include "tests/testing/server_fixture.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo {
namespace {

namespace fs = std::filesystem;

enum Who { kAlice, kBob, kWorker1, kWorker2, kWorker3 };

// ROLE PRINCIPAL and the token of each identity.
const testing::Identities& Identities() {
  static const auto* const ids = new testing::Identities{
      {kAlice, {"client alice", "tok-alice-3e8c1f0a9b7d6e52c4"}},
      {kBob, {"client bob", "tok-bob-7a6b5c4d3e2f1a0b9c"}},
      {kWorker1, {"worker w1", "tok-w1-0f1e2d3c4b5a69788796"}},
      {kWorker2, {"worker w2", "tok-w2-1122334455667788aa"}},
      {kWorker3, {"worker w3", "tok-w3-99aabbccddeeff0011"}},
  };
  return *ids;
}

using testing::In;

class TenantIsolationTest : public testing::InProcessServerTest {
 protected:
  TenantIsolationTest() : InProcessServerTest("tenant") {}
  void SetUp() override {
    InProcessServerTest::SetUp();
    WriteTokens(Identities());
  }

  void TearDown() override {
    for (auto& open : open_) open->context.TryCancel();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    open_.clear();
    InProcessServerTest::TearDown();
  }

  // The fixture's, with a metrics port (the refusals are counted there).
  MutwoServer::Options ServerOptions() {
    MutwoServer::Options options = InProcessServerTest::ServerOptions();
    options.metrics_listen = "127.0.0.1:0";
    return options;
  }

  std::shared_ptr<grpc::Channel> Channel(Who who) {
    // One channel per identity, kept: hundreds of calls share it.
    auto& channel = channels_[who];
    if (channel == nullptr) channel = NewChannel(TokenFile(who));
    return channel;
  }

  grpc::Status Upload(Who who, const std::string& bytes) {
    return testing::UploadModel(*v1::Planner::NewStub(Channel(who)), bytes);
  }

  // Uploads `bytes` as `who` and submits a job for it that no CPU worker
  // can run (it asks for CUDA), so it stays open.
  // `tag` names the model (testing::UncheckedModelArchive).
  std::string SubmitOpenJob(Who who, const std::string& tag,
                            const std::string& device_kind = "cuda") {
    auto planner = v1::Planner::NewStub(Channel(who));
    const std::string bytes = testing::UncheckedModelArchive(tag);
    {
      grpc::Status s = Upload(who, bytes);
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    std::string job_id;
    grpc::Status s = testing::SubmitJob(
        *planner, testing::ChainJobRequest(bytes, device_kind), &job_id);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job_id;
  }

  std::string RegisterCpuWorker(Who who) {
    std::string worker_id;
    grpc::Status s = testing::RegisterCpuWorker(
        *v1::WorkerHub::NewStub(Channel(who)), "", &worker_id);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return worker_id;
  }

  // An open call: a watch (its first event read, or its end) or a lease
  // poll (its answer). Cancelled at TearDown.
  struct Open {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReader<v1::JobEvent>> watch;
    v1::JobEvent event;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::LeaseTaskResponse>>
        poll;
    v1::LeaseTaskResponse lease;
    grpc::Status status;
    bool got_event = false;
    bool ended = false;
  };

  // Opens `n` watches of `job_id` as `who`; returns them once each either
  // sent its first event (admitted) or ended (refused).
  std::vector<Open*> OpenWatches(Who who, const std::string& job_id, int n) {
    auto planner = v1::Planner::NewStub(Channel(who));
    std::vector<Open*> opened;
    for (int i = 0; i < n; ++i) {
      auto open = std::make_unique<Open>();
      open->context.set_deadline(In(60000));
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      // Tag = the Open: the stream started; then Read (first event) or,
      // when it fails, Finish.
      open->watch = planner->AsyncWatchJob(&open->context, request, &cq_,
                                           Tag(open.get(), kStarted));
      opened.push_back(open.get());
      open_.push_back(std::move(open));
    }
    Drive(opened, [](Open* o) { return o->ended || o->got_event; });
    return opened;
  }

  // Opens `n` lease polls of `worker_id` as `who` (30 s waits); returns
  // them after `settle_ms`, by which a refused poll has ended.
  std::vector<Open*> OpenPolls(Who who, const std::string& worker_id, int n,
                               int settle_ms = 1000) {
    auto hub = v1::WorkerHub::NewStub(Channel(who));
    std::vector<Open*> opened;
    for (int i = 0; i < n; ++i) {
      auto open = std::make_unique<Open>();
      open->context.set_deadline(In(60000));
      v1::LeaseTaskRequest request;
      request.set_worker_id(worker_id);
      request.set_wait_ms(30000);
      open->poll = hub->AsyncLeaseTask(&open->context, request, &cq_);
      open->poll->Finish(&open->lease, &open->status,
                         Tag(open.get(), kFinished));
      opened.push_back(open.get());
      open_.push_back(std::move(open));
    }
    const auto until = In(settle_ms);
    Drive(
        opened, [](Open*) { return false; }, until);
    return opened;
  }

  static int Count(const std::vector<Open*>& opens, bool refused) {
    int n = 0;
    for (const Open* o : opens) {
      const bool is_refused =
          o->ended &&
          o->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      if (is_refused == refused) ++n;
    }
    return n;
  }

  // Leases one task for `worker_id` as `who` (waits up to 5 s).
  v1::Task LeaseOne(Who who, const std::string& worker_id) {
    grpc::ClientContext context;
    context.set_deadline(In(10000));
    v1::LeaseTaskRequest request;
    request.set_worker_id(worker_id);
    request.set_wait_ms(5000);
    v1::LeaseTaskResponse response;
    grpc::Status s = v1::WorkerHub::NewStub(Channel(who))
                         ->LeaseTask(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(response.has_task());
    return response.task();
  }

  v1::Job GetJob(Who who, const std::string& job_id) {
    grpc::ClientContext context;
    context.set_deadline(In(10000));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::Status s =
        v1::Planner::NewStub(Channel(who))->GetJob(&context, request, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  grpc::Status ReportProfile(Who who, const std::string& worker_id,
                             const v1::Task& task, const v1::Profile& profile) {
    grpc::ClientContext context;
    context.set_deadline(In(60000));
    v1::ReportProfileRequest request;
    request.set_worker_id(worker_id);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    *request.mutable_profile() = profile;
    v1::ReportResponse response;
    return v1::WorkerHub::NewStub(Channel(who))
        ->ReportProfile(&context, request, &response);
  }

  // Leases tasks as `who` until one of `job_id`'s (the others stay leased).
  v1::Task LeaseTaskOf(Who who, const std::string& worker_id,
                       const std::string& job_id) {
    v1::Task task;
    for (int i = 0; i < 16 && task.job_id() != job_id; ++i) {
      task = LeaseOne(who, worker_id);
    }
    EXPECT_EQ(task.job_id(), job_id);
    return task;
  }

  // The measurement row the server stored with a job's profile, read from
  // its data dir by a second Store (as another process would).
  std::optional<storage::ProfileMeasurement> StoredMeasurement(
      const std::string& job_id, int64_t batch_size) {
    storage::Store::Options options;
    options.data_dir = InProcessServerTest::ServerOptions().data_dir;
    auto store = storage::Store::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return std::nullopt;
    auto m = (*store)->GetProfileMeasurement(job_id, batch_size);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : std::nullopt;
  }

  std::string Metrics() {
    return testing::HttpGet(server_->metrics_port(), "/metrics");
  }

  std::map<Who, std::shared_ptr<grpc::Channel>> channels_;
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Open>> open_;

 private:
  enum Step { kStarted = 0, kRead = 1, kFinished = 2 };
  static void* Tag(Open* open, Step step) {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(open) | step);
  }
  // Runs the completion queue until every Open in `opens` is `done` or has
  // ended, or `until` passes.
  void Drive(const std::vector<Open*>& opens,
             const std::function<bool(Open*)>& done,
             std::chrono::system_clock::time_point until = In(20000)) {
    auto all_done = [&] {
      for (Open* o : opens) {
        if (!done(o) && !o->ended) return false;
      }
      return true;
    };
    while (!all_done()) {
      void* tag;
      bool ok;
      const auto r = cq_.AsyncNext(&tag, &ok, until);
      if (r != grpc::CompletionQueue::GOT_EVENT) return;
      const auto bits = reinterpret_cast<uintptr_t>(tag);
      Open* open = reinterpret_cast<Open*>(bits & ~uintptr_t{3});
      switch (static_cast<Step>(bits & 3)) {
        case kStarted:
          if (ok) {
            open->watch->Read(&open->event, Tag(open, kRead));
          } else {
            open->watch->Finish(&open->status, Tag(open, kFinished));
          }
          break;
        case kRead:
          if (ok) {
            open->got_event = true;
          } else {
            open->watch->Finish(&open->status, Tag(open, kFinished));
          }
          break;
        case kFinished:
          open->ended = true;
          break;
      }
    }
  }
};

// The attack, scaled down: one client opens twice its share of
// watches, as many as the global limit. Only its share is admitted; another
// client's watch still opens.
TEST_F(TenantIsolationTest, OneClientsWatchesLeaveAnotherClientsWatchOpen) {
  MutwoServer::Options options = ServerOptions();
  options.core.max_watchers = 20;
  options.max_watchers_per_client = 10;
  options.core.waiter_retry_after_ms = 1500;
  StartServer(std::move(options));
  const std::string alice_job = SubmitOpenJob(kAlice, "alice's model");
  const std::string bob_job = SubmitOpenJob(kBob, "bob's model");

  std::vector<Open*> alice = OpenWatches(kAlice, alice_job, 20);
  EXPECT_EQ(Count(alice, /*refused=*/false), 10);
  EXPECT_EQ(Count(alice, /*refused=*/true), 10);
  for (const Open* o : alice) {
    if (!o->ended) continue;
    EXPECT_NE(o->status.error_message().find(
                  "watches of \"alice\": 10 open, the limit per principal "
                  "(--max_watchers_per_client); retry in 1500 ms"),
              std::string::npos)
        << o->status.error_message();
    auto hint =
        o->context.GetServerTrailingMetadata().find("grpc-retry-pushback-ms");
    ASSERT_NE(hint, o->context.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(hint->second.data(), hint->second.size()), "1500");
  }

  std::vector<Open*> bob = OpenWatches(kBob, bob_job, 1);
  EXPECT_FALSE(bob[0]->ended) << bob[0]->status.error_message();
  EXPECT_TRUE(bob[0]->got_event);
  EXPECT_EQ(bob[0]->event.state(), v1::Job::QUEUED);

  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find(
                "mutwo_limit_refusals_total{limit=\"max_watchers_per_client\"} "
                "10"),
            std::string::npos)
      << metrics;
  EXPECT_NE(
      metrics.find("mutwo_limit_refusals_total{limit=\"max_watchers\"} 0"),
      std::string::npos);
  std::cout << "{\"test\":\"watches_per_client\",\"alice_opened\":20,"
            << "\"alice_admitted\":" << Count(alice, false)
            << ",\"alice_refused\":" << Count(alice, true)
            << ",\"bob_admitted\":" << (bob[0]->ended ? 0 : 1) << "}\n";

  // Alice's places come back when her watches end.
  for (Open* o : alice) o->context.TryCancel();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<Open*> again = OpenWatches(kAlice, alice_job, 1);
  EXPECT_TRUE(again[0]->got_event) << again[0]->status.error_message();
}

// The same for lease polls: one worker token opens the global limit's worth
// of polls (over several worker ids); another worker's poll still waits.
TEST_F(TenantIsolationTest, OneWorkersPollsLeaveAnotherWorkersPollOpen) {
  MutwoServer::Options options = ServerOptions();
  options.core.max_lease_waiters = 20;
  options.max_lease_waiters_per_worker = 10;
  StartServer(std::move(options));
  const std::string w1a = RegisterCpuWorker(kWorker1);
  const std::string w1b = RegisterCpuWorker(kWorker1);
  const std::string w2 = RegisterCpuWorker(kWorker2);

  std::vector<Open*> greedy = OpenPolls(kWorker1, w1a, 10);
  std::vector<Open*> more = OpenPolls(kWorker1, w1b, 10);
  greedy.insert(greedy.end(), more.begin(), more.end());
  EXPECT_EQ(Count(greedy, /*refused=*/false), 10);
  EXPECT_EQ(Count(greedy, /*refused=*/true), 10);
  for (const Open* o : greedy) {
    if (!o->ended) continue;
    EXPECT_NE(o->status.error_message().find(
                  "lease polls of \"w1\": 10 open, the limit per principal "
                  "(--max_lease_waiters_per_worker)"),
              std::string::npos)
        << o->status.error_message();
  }
  std::vector<Open*> honest = OpenPolls(kWorker2, w2, 1);
  EXPECT_FALSE(honest[0]->ended) << honest[0]->status.error_message();
  const std::string metrics = Metrics();
  EXPECT_NE(
      metrics.find("mutwo_limit_refusals_total{limit=\"max_lease_waiters_per_"
                   "worker\"} 10"),
      std::string::npos)
      << metrics;
  std::cout << "{\"test\":\"lease_polls_per_worker\",\"w1_opened\":20,"
            << "\"w1_admitted\":" << Count(greedy, false)
            << ",\"w1_refused\":" << Count(greedy, true)
            << ",\"w2_admitted\":" << (honest[0]->ended ? 0 : 1) << "}\n";
}

// A worker reports a profile far larger than any real model's: refused at
// once, before it is stored or planned, with the limit and its flag in the
// message; the task fails at once naming the limit (the same model would
// report the same again), so the job ends now, not at the lease's expiry.
TEST_F(TenantIsolationTest, OversizedProfilesAreRefusedAtIngestNamingTheLimit) {
  StartServer(ServerOptions());  // the defaults: 8,192 nodes, 65,536 edges
  const std::string job = SubmitOpenJob(kAlice, "alice's model", "cpu");
  const std::string worker = RegisterCpuWorker(kWorker1);
  const v1::Task task = LeaseOne(kWorker1, worker);
  ASSERT_EQ(task.kind(), v1::Task::PROFILE);

  struct Attack {
    const char* name;
    v1::Profile profile;
    const char* expected;
  };
  const Attack attacks[] = {
      {"chain_16384_nodes", testing::ChainProfile(task.batch_size(), 16384),
       "has 16384 nodes, more than 8192; this server plans profiles up to "
       "--max_profile_nodes"},
      {"dense_4096_nodes_32_sources",
       testing::DenseRecomputeProfile(4096, 32, task.batch_size()),
       "edges (data edges and recompute lineages), more than 65536; this "
       "server plans profiles up to --max_profile_edges"},
  };
  for (const Attack& attack : attacks) {
    const auto start = std::chrono::steady_clock::now();
    grpc::Status s = ReportProfile(kWorker1, worker, task, attack.profile);
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << attack.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(attack.expected), std::string::npos)
        << attack.name << ": " << s.error_message();
    EXPECT_LT(ms, 2000) << attack.name;
    std::cout << "{\"test\":\"oversized_profile\",\"attack\":\"" << attack.name
              << "\",\"bytes\":" << attack.profile.ByteSizeLong()
              << ",\"code\":" << s.error_code() << ",\"ms\":" << ms << "}\n";
  }
  // Nothing stored: no profile for the batch size.
  {
    grpc::ClientContext context;
    context.set_deadline(In(10000));
    v1::GetProfileRequest request;
    request.set_job_id(job);
    request.set_batch_size(task.batch_size());
    v1::Profile profile;
    EXPECT_EQ(v1::Planner::NewStub(Channel(kAlice))
                  ->GetProfile(&context, request, &profile)
                  .error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  const std::string metrics = Metrics();
  EXPECT_NE(
      metrics.find("mutwo_limit_refusals_total{limit=\"max_profile_nodes\"} 1"),
      std::string::npos);
  EXPECT_NE(
      metrics.find("mutwo_limit_refusals_total{limit=\"max_profile_edges\"} 1"),
      std::string::npos);
  // The task failed with the first refusal: a later report of it is
  // refused, and the job ended naming the limit, not the lease.
  grpc::Status later = ReportProfile(
      kWorker1, worker, task, testing::ChainProfile(task.batch_size(), 8));
  EXPECT_EQ(later.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << later.error_message();
  grpc::ClientContext context;
  context.set_deadline(In(10000));
  v1::GetJobRequest request;
  request.set_job_id(job);
  v1::Job ended;
  ASSERT_TRUE(v1::Planner::NewStub(Channel(kAlice))
                  ->GetJob(&context, request, &ended)
                  .ok());
  EXPECT_EQ(ended.state(), v1::Job::FAILED);
  EXPECT_NE(ended.error().find("--max_profile_nodes"), std::string::npos)
      << ended.error();
}

// Random bytes: no two models alike, nothing to deduplicate.
std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// The attack, scaled down: one client stores blob after blob of
// random bytes. Past its quota it is refused, naming the quota; a model it
// already holds is still free to upload again; another client with its own
// quota (an operator's override) still uploads.
TEST_F(TenantIsolationTest, StoredModelQuotaStopsOneClientFillingTheStore) {
  MutwoServer::Options options = ServerOptions();
  options.max_stored_model_bytes_per_client = 1 << 20;  // 1 MiB
  options.model_quota_overrides["bob"] = 2 << 20;
  StartServer(std::move(options));
  const size_t kBlob = 300 << 10;
  std::vector<grpc::Status> alice;
  for (int i = 0; i < 5; ++i) {
    alice.push_back(Upload(kAlice, RandomBytes(kBlob, i)));
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(alice[i].ok()) << i << ": " << alice[i].error_message();
  }
  for (int i = 3; i < 5; ++i) {
    EXPECT_EQ(alice[i].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << i << ": " << alice[i].error_message();
    EXPECT_NE(alice[i].error_message().find(
                  "upload: \"alice\" stores 900.00 KiB of models; this "
                  "model's 300.00 KiB would pass its quota of 1.00 MiB "
                  "(--max_stored_model_bytes_per_client"),
              std::string::npos)
        << alice[i].error_message();
  }
  // Nothing of the refused uploads stored; a model alice holds is free.
  EXPECT_TRUE(Upload(kAlice, RandomBytes(kBlob, 0)).ok());
  for (int i = 10; i < 16; ++i) {
    grpc::Status s = Upload(kBob, RandomBytes(kBlob, i));
    EXPECT_TRUE(s.ok()) << i << ": " << s.error_message();
  }
  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find("mutwo_limit_refusals_total{limit=\"max_stored_"
                         "model_bytes_per_client\"} 2"),
            std::string::npos)
      << metrics;
  int stored = 0;
  for (const grpc::Status& st : alice) stored += st.ok() ? 1 : 0;
  std::cout << "{\"test\":\"stored_model_quota\",\"alice_uploads\":"
            << alice.size() << ",\"alice_stored\":" << stored
            << ",\"alice_refused\":" << alice.size() - stored << "}\n";
}

// Temp files of uploads in progress (storage/durable_file.h's prefix).
int TempFiles(const fs::path& models) {
  int n = 0;
  if (!fs::exists(models)) return 0;
  for (const auto& e : fs::directory_iterator(models)) {
    if (absl::StartsWith(e.path().filename().string(), ".tmp-")) ++n;
  }
  return n;
}

// A client sends an upload's header and then nothing, holding its stream
// open: dropped after --upload_idle_timeout_ms, its temp file removed and
// its place among the client's running uploads given back.
TEST_F(TenantIsolationTest, IdleUploadIsDroppedAndItsPlaceFreed) {
  MutwoServer::Options options = ServerOptions();
  options.upload_idle_timeout_ms = 500;
  options.core.max_uploads_per_client = 1;
  StartServer(std::move(options));
  grpc::ClientContext context;
  context.set_deadline(In(30000));
  v1::UploadModelResponse response;
  auto writer =
      v1::Planner::NewStub(Channel(kAlice))->UploadModel(&context, &response);
  v1::UploadModelRequest header;
  header.mutable_header()->set_sha256(Sha256Hex("never sent"));
  header.mutable_header()->set_size_bytes(1 << 20);
  header.mutable_header()->set_name("idle");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(writer->Write(header));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(TempFiles(dir_ / "data" / "models"), 1);
  // The client holds the stream open; Finish returns when the server ends
  // the call.
  const grpc::Status s = writer->Finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_LT(seconds, 2.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(TempFiles(dir_ / "data" / "models"), 0);
  // The only upload place of alice is free again.
  grpc::Status next = Upload(kAlice, "a real model");
  EXPECT_TRUE(next.ok()) << next.error_message();
  EXPECT_NE(
      Metrics().find(
          "mutwo_limit_refusals_total{limit=\"upload_idle_timeout_ms\"} 1"),
      std::string::npos);
  std::cout << "{\"test\":\"idle_upload\",\"idle_timeout_ms\":500,"
            << "\"dropped_after_s\":" << seconds << "}\n";
}

// The cache poisoning: a rogue worker reports a forged profile (tiny
// activations) for alice's job; bob's later job on the same model, spec and
// budget is profiled honestly by another worker. Bob's schedules and knee
// must be planned from bob's profile: the cache entry of alice's forged
// profile is alice's alone.
TEST_F(TenantIsolationTest, ForgedProfileForOneTenantNeverReachesAnother) {
  StartServer(ServerOptions());
  const std::string model = "the same model bytes";
  const std::string alice_job = SubmitOpenJob(kAlice, model, "cpu");
  const std::string rogue = RegisterCpuWorker(kWorker1);
  const v1::Task forged_task = LeaseOne(kWorker1, rogue);
  ASSERT_EQ(forged_task.job_id(), alice_job);
  // 1 KiB activations instead of 1 MiB: every figure 1,000 times too small.
  const v1::Profile forged =
      testing::ChainProfile(forged_task.batch_size(), 8, 1 << 10, 4 << 10);
  ASSERT_TRUE(ReportProfile(kWorker1, rogue, forged_task, forged).ok());

  const std::string bob_job = SubmitOpenJob(kBob, model, "cpu");
  const std::string honest = RegisterCpuWorker(kWorker2);
  v1::Task bob_task;
  for (int i = 0; i < 8 && bob_task.job_id() != bob_job; ++i) {
    bob_task = LeaseOne(kWorker2, honest);  // alice's VALIDATE tasks first
  }
  ASSERT_EQ(bob_task.job_id(), bob_job);
  ASSERT_EQ(bob_task.kind(), v1::Task::PROFILE);
  const v1::Profile real = testing::ChainProfile(bob_task.batch_size());
  ASSERT_TRUE(ReportProfile(kWorker2, honest, bob_task, real).ok());

  const v1::Job alice = GetJob(kAlice, alice_job);
  const v1::Job bob = GetJob(kBob, bob_job);
  ASSERT_EQ(alice.results_size(), 1);
  ASSERT_EQ(bob.results_size(), 1);
  const v1::BatchResult& a = alice.results(0);
  const v1::BatchResult& b = bob.results(0);
  ASSERT_EQ(a.schedules_size(), 1);
  ASSERT_EQ(b.schedules_size(), 1);
  // Bob's budget schedule and knee come from bob's profile (the same
  // baseline as his result's), not from alice's forged numbers.
  EXPECT_EQ(b.schedules(0).baseline_peak_bytes(), b.baseline_peak_bytes());
  EXPECT_NE(b.schedules(0).baseline_peak_bytes(),
            a.schedules(0).baseline_peak_bytes());
  EXPECT_NE(b.schedules(0).budget_bytes(), a.schedules(0).budget_bytes());
  EXPECT_NE(b.floor_bytes(), a.floor_bytes());
  EXPECT_GT(b.schedules(0).budget_bytes(), 100 * a.schedules(0).budget_bytes());
  std::cout << "{\"test\":\"cache_poisoning\",\"alice_forged_baseline\":"
            << a.schedules(0).baseline_peak_bytes()
            << ",\"alice_budget_bytes\":" << a.schedules(0).budget_bytes()
            << ",\"bob_baseline\":" << b.schedules(0).baseline_peak_bytes()
            << ",\"bob_budget_bytes\":" << b.schedules(0).budget_bytes()
            << ",\"bob_floor\":" << b.floor_bytes()
            << ",\"alice_floor\":" << a.floor_bytes() << "}\n";
}

// The rogue worker, which failed 10 of 10 tasks it leased: after 3
// failures (the limit here) it is quarantined, its next lease poll is
// refused naming why, and an honest worker leases the tasks it gave back.
TEST_F(TenantIsolationTest, RogueWorkerThatFailsEveryTaskIsQuarantined) {
  MutwoServer::Options options = ServerOptions();
  options.worker_quarantine_failures = 3;
  options.worker_quarantine_window_ms = 60000;
  // The rogue may lease one task 3 times; no task runs out of attempts.
  options.core.max_attempts = 10;
  StartServer(std::move(options));
  for (int i = 0; i < 4; ++i) {
    SubmitOpenJob(kAlice, absl::StrCat("alice's model ", i), "cpu");
  }
  const std::string rogue = RegisterCpuWorker(kWorker1);
  const std::string honest = RegisterCpuWorker(kWorker2);
  auto hub = v1::WorkerHub::NewStub(Channel(kWorker1));
  for (int i = 0; i < 3; ++i) {
    const v1::Task task = LeaseOne(kWorker1, rogue);
    ASSERT_FALSE(task.task_id().empty()) << i;
    grpc::ClientContext context;
    context.set_deadline(In(10000));
    v1::FailTaskRequest request;
    request.set_worker_id(rogue);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    request.set_reason("forged failure");
    request.set_retryable(true);
    v1::ReportResponse response;
    ASSERT_TRUE(hub->FailTask(&context, request, &response).ok()) << i;
  }
  grpc::ClientContext context;
  context.set_deadline(In(10000));
  v1::LeaseTaskRequest request;
  request.set_worker_id(rogue);
  request.set_wait_ms(1000);
  v1::LeaseTaskResponse response;
  grpc::Status refused = hub->LeaseTask(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(response.has_task());
  EXPECT_NE(refused.error_message().find(
                absl::StrCat("worker ", rogue, " is quarantined for")),
            std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find(
                "3 failures within 60000 ms (--worker_quarantine_failures, "
                "--worker_quarantine_window_ms), the last: task failed: "
                "forged failure"),
            std::string::npos)
      << refused.error_message();
  // The honest worker leases every task, the 3 given back included.
  int leased = 0;
  for (int i = 0; i < 4; ++i) {
    if (!LeaseOne(kWorker2, honest).task_id().empty()) ++leased;
  }
  EXPECT_EQ(leased, 4);
  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find("mutwo_workers_quarantined 1"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("mutwo_worker_quarantines_total 1"),
            std::string::npos);
  std::cout << "{\"test\":\"rogue_worker_quarantine\",\"failed\":3,"
            << "\"rogue_next_lease\":\"" << refused.error_code()
            << "\",\"honest_leased\":" << leased << "}\n";
}

}  // namespace
}  // namespace mutwo

namespace mutwo {
namespace {

// An honest re-measurement of ChainProfile: the same peak, another step
// time (so another digest).
v1::Profile Remeasured(int64_t batch_size, double iteration_ms) {
  v1::Profile p = testing::ChainProfile(batch_size);
  p.mutable_measured()->set_iteration_ms(iteration_ms);
  return p;
}

// The attack within one tenant: a rogue worker forges the profile
// of alice's first job; her second job, on the same model and spec, is
// profiled honestly by another worker. With entries keyed by tenant alone,
// the second job was answered from the cache with the forged figures. Now
// the entry carries the profile's digest and the worker: the second job is
// planned from its own profile, and its profile, which disagrees with the
// forged one, is flagged (stored with the profile, counted, logged).
TEST_F(TenantIsolationTest, ForgedProfileNeverReachesTheSameTenantsNextJob) {
  StartServer(ServerOptions());
  const std::string model = "alice's model";
  const std::string first = SubmitOpenJob(kAlice, model, "cpu");
  const std::string rogue = RegisterCpuWorker(kWorker1);
  const v1::Task forged_task = LeaseTaskOf(kWorker1, rogue, first);
  const v1::Profile forged =
      testing::ChainProfile(forged_task.batch_size(), 8, 1 << 10, 4 << 10);
  ASSERT_TRUE(ReportProfile(kWorker1, rogue, forged_task, forged).ok());

  const std::string second = SubmitOpenJob(kAlice, model, "cpu");
  const std::string honest = RegisterCpuWorker(kWorker2);
  const v1::Task task = LeaseTaskOf(kWorker2, honest, second);
  ASSERT_EQ(task.kind(), v1::Task::PROFILE);
  ASSERT_TRUE(ReportProfile(kWorker2, honest, task,
                            testing::ChainProfile(task.batch_size()))
                  .ok());

  const v1::Job a = GetJob(kAlice, first);
  const v1::Job b = GetJob(kAlice, second);
  ASSERT_EQ(a.results_size(), 1);
  ASSERT_EQ(b.results_size(), 1);
  ASSERT_EQ(b.results(0).schedules_size(), 1);
  const v1::Schedule& got = b.results(0).schedules(0);
  EXPECT_EQ(got.baseline_peak_bytes(), b.results(0).baseline_peak_bytes());
  EXPECT_GT(got.budget_bytes(), 100 * a.results(0).schedules(0).budget_bytes());
  EXPECT_GT(b.results(0).floor_bytes(), 100 * a.results(0).floor_bytes());

  // GetSchedule for the second job at a new budget: its own profile too.
  {
    grpc::ClientContext context;
    context.set_deadline(In(30000));
    v1::GetScheduleRequest request;
    request.set_job_id(second);
    request.set_batch_size(task.batch_size());
    *request.mutable_budget() = *ParseBudget("60%");
    v1::Schedule schedule;
    grpc::Status s = v1::Planner::NewStub(Channel(kAlice))
                         ->GetSchedule(&context, request, &schedule);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(schedule.budget_bytes(), got.budget_bytes());
  }

  const auto forged_row = StoredMeasurement(first, forged_task.batch_size());
  const auto honest_row = StoredMeasurement(second, task.batch_size());
  ASSERT_TRUE(forged_row.has_value());
  ASSERT_TRUE(honest_row.has_value());
  EXPECT_EQ(forged_row->worker_principal, "w1");
  EXPECT_EQ(forged_row->worker_id, rogue);
  EXPECT_TRUE(forged_row->flag.empty()) << forged_row->flag;
  EXPECT_EQ(honest_row->worker_principal, "w2");
  EXPECT_NE(honest_row->profile_sha256, forged_row->profile_sha256);
  EXPECT_TRUE(absl::StrContains(honest_row->flag, "disagrees"))
      << honest_row->flag;
  EXPECT_TRUE(absl::StrContains(honest_row->flag, first)) << honest_row->flag;
  const std::string metrics = Metrics();
  EXPECT_TRUE(absl::StrContains(metrics, "mutwo_profile_disagreements_total 1"))
      << metrics;
  EXPECT_TRUE(absl::StrContains(
      metrics, "mutwo_schedule_cache_requests_total{result=\"shared_hit\"} 0"))
      << metrics;
  std::cout << "{\"test\":\"same_tenant_poisoning\",\"forged_budget_bytes\":"
            << a.results(0).schedules(0).budget_bytes()
            << ",\"second_job_budget_bytes\":" << got.budget_bytes()
            << ",\"second_job_floor\":" << b.results(0).floor_bytes()
            << ",\"flag\":\"" << honest_row->flag << "\"}\n";
}

// Sharing across tenants, only from a profile the server trusts: alice's
// job is profiled by w2, an operator-trusted worker principal; bob's job,
// profiled by w3 with a profile that agrees (the same peak, another step
// time), is answered with alice's schedules from the shared entry. Then a
// rogue (w1) forges bob's next job's profile: it disagrees, is flagged and
// is never shared, and from then on no job of that key is answered from a
// shared entry (alice's next job, trusted worker and all, is planned from
// its own profile).
TEST_F(TenantIsolationTest, OnlyTrustedAgreeingProfilesAreSharedAcrossTenants) {
  MutwoServer::Options options = ServerOptions();
  options.core.profile_trust.trusted_worker_principals = {"w2"};
  StartServer(std::move(options));
  const std::string model = "the same model bytes";
  const std::string trusted = RegisterCpuWorker(kWorker2);
  const std::string other = RegisterCpuWorker(kWorker3);
  const std::string rogue = RegisterCpuWorker(kWorker1);

  const std::string alice_job = SubmitOpenJob(kAlice, model, "cpu");
  const v1::Task alice_task = LeaseTaskOf(kWorker2, trusted, alice_job);
  ASSERT_TRUE(ReportProfile(kWorker2, trusted, alice_task,
                            Remeasured(alice_task.batch_size(), 24.0))
                  .ok());
  const std::string bob_job = SubmitOpenJob(kBob, model, "cpu");
  const v1::Task bob_task = LeaseTaskOf(kWorker3, other, bob_job);
  ASSERT_TRUE(ReportProfile(kWorker3, other, bob_task,
                            Remeasured(bob_task.batch_size(), 25.0))
                  .ok());
  const v1::Job alice = GetJob(kAlice, alice_job);
  const v1::Job bob = GetJob(kBob, bob_job);
  ASSERT_EQ(alice.results_size(), 1);
  ASSERT_EQ(bob.results_size(), 1);
  ASSERT_EQ(bob.results(0).schedules_size(), 1);
  // Served alice's (trusted) schedule: the same plan, step times scaled
  // from alice's profile, not bob's.
  EXPECT_EQ(bob.results(0).schedules(0).budget_bytes(),
            alice.results(0).schedules(0).budget_bytes());
  EXPECT_EQ(bob.results(0).schedules(0).baseline_iteration_ms(),
            alice.results(0).schedules(0).baseline_iteration_ms());
  std::string metrics = Metrics();
  // The knee and the one budget.
  EXPECT_TRUE(absl::StrContains(
      metrics, "mutwo_schedule_cache_requests_total{result=\"shared_hit\"} 2"))
      << metrics;

  const std::string bob_next = SubmitOpenJob(kBob, model, "cpu");
  const v1::Task forged_task = LeaseTaskOf(kWorker1, rogue, bob_next);
  const v1::Profile forged =
      testing::ChainProfile(forged_task.batch_size(), 8, 1 << 10, 4 << 10);
  ASSERT_TRUE(ReportProfile(kWorker1, rogue, forged_task, forged).ok());
  const auto forged_row = StoredMeasurement(bob_next, forged_task.batch_size());
  ASSERT_TRUE(forged_row.has_value());
  EXPECT_TRUE(absl::StrContains(forged_row->flag, "disagrees"))
      << forged_row->flag;

  const std::string alice_next = SubmitOpenJob(kAlice, model, "cpu");
  const v1::Task next_task = LeaseTaskOf(kWorker2, trusted, alice_next);
  ASSERT_TRUE(ReportProfile(kWorker2, trusted, next_task,
                            Remeasured(next_task.batch_size(), 30.0))
                  .ok());
  const v1::Job next = GetJob(kAlice, alice_next);
  ASSERT_EQ(next.results_size(), 1);
  ASSERT_EQ(next.results(0).schedules_size(), 1);
  // Planned from its own profile (30 ms steps), not alice's first (24 ms).
  EXPECT_NE(next.results(0).schedules(0).baseline_iteration_ms(),
            alice.results(0).schedules(0).baseline_iteration_ms());
  metrics = Metrics();
  EXPECT_TRUE(absl::StrContains(
      metrics, "mutwo_schedule_cache_requests_total{result=\"shared_hit\"} 2"))
      << metrics;
  // The rogue's profile and alice's next one each disagree with the other.
  EXPECT_TRUE(absl::StrContains(metrics, "mutwo_profile_disagreements_total 2"))
      << metrics;
  std::cout << "{\"test\":\"trusted_sharing\",\"alice_budget_bytes\":"
            << alice.results(0).schedules(0).budget_bytes()
            << ",\"bob_budget_bytes\":"
            << bob.results(0).schedules(0).budget_bytes()
            << ",\"forged_flag\":\"" << forged_row->flag << "\"}\n";
}

// A rogue holding tokens of two worker principals (w1 and w3, which the
// operator knows to be one organisation's) forges the same profile (the
// honest peak, a 999 ms step instead of ~24 ms) for alice's job and for
// bob's. With "another principal agrees" as the rule, bob's forged profile
// was confirmed by alice's and its schedules were shared: alice's next job,
// profiled honestly by w2, was answered with the forged 999 ms schedule.
// Now a confirmation must come from another declared trust domain.
TEST_F(TenantIsolationTest, RogueWithTwoWorkerTokensCannotConfirmItsForgery) {
  MutwoServer::Options options = ServerOptions();
  options.core.profile_trust.worker_trust_domains = {
      {"w1", "rogue-org"}, {"w3", "rogue-org"}, {"w2", "org-b"}};
  StartServer(std::move(options));
  const std::string model = "the same model bytes";
  const std::string rogue_a = RegisterCpuWorker(kWorker1);
  const std::string rogue_b = RegisterCpuWorker(kWorker3);
  const std::string honest = RegisterCpuWorker(kWorker2);

  const std::string alice_job = SubmitOpenJob(kAlice, model, "cpu");
  const v1::Task alice_task = LeaseTaskOf(kWorker1, rogue_a, alice_job);
  ASSERT_TRUE(ReportProfile(kWorker1, rogue_a, alice_task,
                            Remeasured(alice_task.batch_size(), 999.0))
                  .ok());
  const std::string bob_job = SubmitOpenJob(kBob, model, "cpu");
  const v1::Task bob_task = LeaseTaskOf(kWorker3, rogue_b, bob_job);
  ASSERT_TRUE(ReportProfile(kWorker3, rogue_b, bob_task,
                            Remeasured(bob_task.batch_size(), 999.0))
                  .ok());
  const v1::Job bob = GetJob(kBob, bob_job);
  ASSERT_EQ(bob.results_size(), 1);
  ASSERT_EQ(bob.results(0).schedules_size(), 1);
  const double forged_ms = bob.results(0).schedules(0).baseline_iteration_ms();

  const std::string alice_next = SubmitOpenJob(kAlice, model, "cpu");
  const v1::Task next_task = LeaseTaskOf(kWorker2, honest, alice_next);
  ASSERT_TRUE(ReportProfile(kWorker2, honest, next_task,
                            Remeasured(next_task.batch_size(), 24.0))
                  .ok());
  const v1::Job next = GetJob(kAlice, alice_next);
  ASSERT_EQ(next.results_size(), 1);
  ASSERT_EQ(next.results(0).schedules_size(), 1);
  const double next_ms = next.results(0).schedules(0).baseline_iteration_ms();
  // Planned from its own 24 ms profile, not the rogue's 999 ms one.
  EXPECT_LT(next_ms, forged_ms / 10);
  const std::string metrics = Metrics();
  EXPECT_TRUE(absl::StrContains(
      metrics, "mutwo_schedule_cache_requests_total{result=\"shared_hit\"} 0"))
      << metrics;
  std::cout << "{\"test\":\"rogue_two_tokens\",\"forged_step_ms\":" << forged_ms
            << ",\"victim_step_ms\":" << next_ms << "}\n";
}

// The rule still shares what independent workers agree on: alice's job
// profiled by w2 (org-a), bob's by w3 (org-b) with the same peak: bob's
// profile is confirmed and shared, and alice's next job, profiled by w1 (of
// no declared domain) with an agreeing profile, is answered from it.
TEST_F(TenantIsolationTest, WorkersOfTwoDeclaredDomainsConfirmEachOther) {
  MutwoServer::Options options = ServerOptions();
  options.core.profile_trust.worker_trust_domains = {{"w2", "org-a"},
                                                     {"w3", "org-b"}};
  StartServer(std::move(options));
  const std::string model = "the same model bytes";
  const std::string a = RegisterCpuWorker(kWorker2);
  const std::string b = RegisterCpuWorker(kWorker3);
  const std::string c = RegisterCpuWorker(kWorker1);
  const std::string alice_job = SubmitOpenJob(kAlice, model, "cpu");
  const v1::Task alice_task = LeaseTaskOf(kWorker2, a, alice_job);
  ASSERT_TRUE(ReportProfile(kWorker2, a, alice_task,
                            Remeasured(alice_task.batch_size(), 24.0))
                  .ok());
  const std::string bob_job = SubmitOpenJob(kBob, model, "cpu");
  const v1::Task bob_task = LeaseTaskOf(kWorker3, b, bob_job);
  ASSERT_TRUE(ReportProfile(kWorker3, b, bob_task,
                            Remeasured(bob_task.batch_size(), 25.0))
                  .ok());
  const std::string alice_next = SubmitOpenJob(kAlice, model, "cpu");
  const v1::Task next_task = LeaseTaskOf(kWorker1, c, alice_next);
  ASSERT_TRUE(ReportProfile(kWorker1, c, next_task,
                            Remeasured(next_task.batch_size(), 30.0))
                  .ok());
  const v1::Job bob = GetJob(kBob, bob_job);
  const v1::Job next = GetJob(kAlice, alice_next);
  ASSERT_EQ(next.results_size(), 1);
  ASSERT_EQ(next.results(0).schedules_size(), 1);
  // Bob's confirmed schedule (25 ms steps), not one of its own (30 ms).
  EXPECT_EQ(next.results(0).schedules(0).baseline_iteration_ms(),
            bob.results(0).schedules(0).baseline_iteration_ms());
  EXPECT_TRUE(absl::StrContains(
      Metrics(),
      "mutwo_schedule_cache_requests_total{result=\"shared_hit\"} 2"));
}

}  // namespace
}  // namespace mutwo
