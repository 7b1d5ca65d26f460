// Authentication and authorization of mutwo-server, against an
// in-process MutwoServer on a loopback port with a tokens file: every RPC
// called as each of {no token, client, other client, worker, other worker,
// admin} on the client's own job (the other client's view is the "other
// job" case), and what each identity may do to leases and models.
#include <filesystem>
#include <fstream>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "server/auth/token_table.h"
#include "server/server.h"
#include "tests/testing/command.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/process.h"
#include "tests/testing/server_fixture.h"
#include "tests/testing/synthetic_profile.h"
#include "tests/testing/training_loop_request.h"

namespace mutwo {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

enum Who { kNone, kClient, kOtherClient, kWorker, kOtherWorker, kAdmin };
constexpr Who kEveryone[] = {kNone,   kClient,      kOtherClient,
                             kWorker, kOtherWorker, kAdmin};

const char* WhoName(Who who) {
  switch (who) {
    case kNone:
      return "no token";
    case kClient:
      return "client alice";
    case kOtherClient:
      return "other client bob";
    case kWorker:
      return "worker w1";
    case kOtherWorker:
      return "other worker w2";
    case kAdmin:
      return "admin root";
  }
  return "?";
}

// Tokens: long random-looking strings; the file holds only their hashes.
const testing::Identities& Identities() {
  static const auto* const ids = new testing::Identities{
      {kClient, {"client alice", "tok-alice-5f2b9c0e7d4a8e61b3"}},
      {kOtherClient, {"client bob", "tok-bob-0c9d8e7f6a5b4c3d2e"}},
      {kWorker, {"worker w1", "tok-w1-a1b2c3d4e5f6a7b8c9"}},
      {kOtherWorker, {"worker w2", "tok-w2-9f8e7d6c5b4a39281706"}},
      {kAdmin, {"admin root", "tok-root-77aa88bb99cc00dd11"}},
  };
  return *ids;
}

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class AuthTest : public testing::InProcessServerTest {
 protected:
  AuthTest() : InProcessServerTest("auth") {}
  void SetUp() override {
    InProcessServerTest::SetUp();
    WriteTokens(Identities(), "# role principal sha256:hex\n\n");
  }

  std::shared_ptr<grpc::Channel> Channel(Who who,
                                         ClientCredentialsOptions base = {}) {
    return NewChannel(who == kNone ? "" : TokenFile(who), std::move(base));
  }
  std::unique_ptr<v1::Planner::Stub> Planner(Who who) {
    return v1::Planner::NewStub(Channel(who));
  }
  std::unique_ptr<v1::WorkerHub::Stub> Hub(Who who) {
    return v1::WorkerHub::NewStub(Channel(who));
  }
  static void Deadline(grpc::ClientContext& context) {
    context.set_deadline(testing::In(10000));
  }

  // Models are named by a tag: their bytes are
  // testing::UncheckedModelArchive(tag), which the check at submit accepts.
  grpc::Status Upload(Who who, const std::string& tag,
                      v1::UploadModelResponse* out = nullptr) {
    return testing::UploadModel(*Planner(who),
                                testing::UncheckedModelArchive(tag), out);
  }

  v1::SubmitJobRequest JobRequest(const std::string& tag,
                                  const std::string& device_kind = "") {
    return testing::ChainJobRequest(testing::UncheckedModelArchive(tag),
                                    device_kind);
  }

  grpc::Status Submit(Who who, const v1::SubmitJobRequest& request,
                      std::string* job_id = nullptr) {
    return testing::SubmitJob(*Planner(who), request, job_id);
  }

  grpc::Status Register(Who who, const std::string& worker_id = "",
                        std::string* out = nullptr) {
    return testing::RegisterCpuWorker(*Hub(who), worker_id, out);
  }

  grpc::Status Lease(Who who, const std::string& worker_id,
                     v1::LeaseTaskResponse* out = nullptr) {
    grpc::ClientContext context;
    Deadline(context);
    v1::LeaseTaskRequest request;
    request.set_worker_id(worker_id);
    request.set_wait_ms(0);
    v1::LeaseTaskResponse response;
    grpc::Status s = Hub(who)->LeaseTask(&context, request, &response);
    if (out != nullptr) *out = response;
    return s;
  }

  grpc::Status Fetch(Who who, const std::string& tag) {
    const std::string model = testing::UncheckedModelArchive(tag);
    grpc::ClientContext context;
    Deadline(context);
    v1::FetchModelRequest request;
    request.set_sha256(Sha256Hex(model));
    auto reader = Hub(who)->FetchModel(&context, request);
    v1::FetchModelChunk chunk;
    std::string bytes;
    while (reader->Read(&chunk)) bytes += chunk.data();
    grpc::Status s = reader->Finish();
    if (s.ok()) EXPECT_EQ(bytes, model);
    return s;
  }

  grpc::Status GetJob(Who who, const std::string& job_id) {
    grpc::ClientContext context;
    Deadline(context);
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    return Planner(who)->GetJob(&context, request, &job);
  }

  // Reads the first event; a refused call ends the stream with its status.
  grpc::Status Watch(Who who, const std::string& job_id) {
    grpc::ClientContext context;
    Deadline(context);
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    auto reader = Planner(who)->WatchJob(&context, request);
    v1::JobEvent event;
    if (reader->Read(&event)) {
      context.TryCancel();
      reader->Finish().IgnoreError();
      return grpc::Status::OK;
    }
    return reader->Finish();
  }

  grpc::Status Cancel(Who who, const std::string& job_id) {
    grpc::ClientContext context;
    Deadline(context);
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    return Planner(who)->CancelJob(&context, request, &job);
  }

  grpc::Status Profile(Who who, const std::string& job_id) {
    grpc::ClientContext context;
    Deadline(context);
    v1::GetProfileRequest request;
    request.set_job_id(job_id);
    request.set_batch_size(8);
    v1::Profile profile;
    return Planner(who)->GetProfile(&context, request, &profile);
  }

  grpc::Status Schedule(Who who, const std::string& job_id) {
    grpc::ClientContext context;
    Deadline(context);
    v1::GetScheduleRequest request;
    request.set_job_id(job_id);
    request.set_batch_size(8);
    *request.mutable_budget() = *ParseBudget("50%");
    v1::Schedule schedule;
    return Planner(who)->GetSchedule(&context, request, &schedule);
  }

  grpc::Status TrainingLoop(Who who, const std::string& job_id,
                            const v1::Schedule& schedule) {
    grpc::ClientContext context;
    Deadline(context);
    const v1::ReportTrainingLoopRequest request =
        testing::TrainingLoopRequest(job_id, schedule, 1);
    v1::ReportTrainingLoopResponse response;
    return Planner(who)->ReportTrainingLoop(&context, request, &response);
  }

  grpc::Status ListJobs(Who who, std::vector<std::string>* ids = nullptr) {
    grpc::ClientContext context;
    Deadline(context);
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    grpc::Status s = Planner(who)->ListJobs(&context, request, &response);
    if (ids != nullptr) {
      for (const auto& j : response.jobs()) ids->push_back(j.job_id());
    }
    return s;
  }

  grpc::Status ListWorkers(Who who) {
    grpc::ClientContext context;
    Deadline(context);
    v1::ListWorkersRequest request;
    v1::ListWorkersResponse response;
    return Planner(who)->ListWorkers(&context, request, &response);
  }

  grpc::Status Heartbeat(Who who, const std::string& worker_id,
                         const v1::Task& task) {
    grpc::ClientContext context;
    Deadline(context);
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    v1::HeartbeatResponse response;
    grpc::Status s = Hub(who)->Heartbeat(&context, request, &response);
    if (s.ok()) EXPECT_TRUE(response.lease_valid());
    return s;
  }

  grpc::Status ReportProfile(Who who, const std::string& worker_id,
                             const v1::Task& task) {
    grpc::ClientContext context;
    Deadline(context);
    v1::ReportProfileRequest request;
    request.set_worker_id(worker_id);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    *request.mutable_profile() = testing::ChainProfile(task.batch_size());
    v1::ReportResponse response;
    grpc::Status s = Hub(who)->ReportProfile(&context, request, &response);
    EXPECT_EQ(response.accepted(), s.ok());
    return s;
  }

  grpc::Status ReportValidation(Who who, const std::string& worker_id,
                                const v1::Task& task) {
    grpc::ClientContext context;
    Deadline(context);
    v1::ReportValidationRequest request;
    request.set_worker_id(worker_id);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    v1::ReportResponse response;
    return Hub(who)->ReportValidation(&context, request, &response);
  }

  grpc::Status FailTask(Who who, const std::string& worker_id,
                        const v1::Task& task) {
    grpc::ClientContext context;
    Deadline(context);
    v1::FailTaskRequest request;
    request.set_worker_id(worker_id);
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    request.set_reason("test");
    request.set_retryable(true);
    v1::ReportResponse response;
    return Hub(who)->FailTask(&context, request, &response);
  }

  // Calls `call` as every identity and checks each code against `expected`
  // (kWorker's and kClient's allowed calls run last, so a call that changes
  // state is seen by the refused ones first).
  void ExpectMatrix(const std::string& rpc,
                    const std::function<grpc::Status(Who)>& call,
                    const std::map<Who, grpc::StatusCode>& expected) {
    for (Who who :
         {kNone, kOtherClient, kOtherWorker, kAdmin, kClient, kWorker}) {
      auto it = expected.find(who);
      ASSERT_NE(it, expected.end()) << rpc << " " << WhoName(who);
      const grpc::Status s = call(who);
      EXPECT_EQ(s.error_code(), it->second)
          << rpc << " as " << WhoName(who) << ": " << s.error_message();
    }
  }
};

constexpr auto OK = grpc::StatusCode::OK;
constexpr auto UNAUTH = grpc::StatusCode::UNAUTHENTICATED;
constexpr auto DENIED = grpc::StatusCode::PERMISSION_DENIED;
constexpr auto NOT_FOUND = grpc::StatusCode::NOT_FOUND;

// The whole matrix on alice's job: bob (other client) sees it as missing,
// workers may not read jobs, only w1 (the lease holder) may heartbeat,
// report, fail the task and fetch its model.
TEST_F(AuthTest, EveryRpcAsEveryIdentityOnAnOwnAndAnotherClientsJob) {
  StartServer(ServerOptions());
  const std::string alice_model = "alice's torchscript bytes";
  const std::string bob_model = "bob's torchscript bytes";
  ASSERT_TRUE(Upload(kClient, alice_model).ok());
  ASSERT_TRUE(Upload(kOtherClient, bob_model).ok());
  std::string job;      // alice's, leased by w1
  std::string bob_job;  // bob's, for cuda: no CPU worker leases it
  ASSERT_TRUE(Submit(kClient, JobRequest(alice_model), &job).ok());
  ASSERT_TRUE(
      Submit(kOtherClient, JobRequest(bob_model, "cuda"), &bob_job).ok());
  std::string w1, w2;
  ASSERT_TRUE(Register(kWorker, "", &w1).ok());
  ASSERT_TRUE(Register(kOtherWorker, "", &w2).ok());
  v1::LeaseTaskResponse lease;
  ASSERT_TRUE(Lease(kWorker, w1, &lease).ok());
  ASSERT_TRUE(lease.has_task());
  const v1::Task task = lease.task();
  ASSERT_EQ(task.job_id(), job);
  // A worker calls WorkerHub with its own id; the other worker and the
  // others try the lease holder's id (a stolen id or a guessed fence).
  auto id_of = [&](Who who) { return who == kOtherWorker ? w2 : w1; };

  // ---- Planner service ----
  ExpectMatrix("UploadModel",
               [&](Who who) { return Upload(who, "another model"); },
               {{kNone, UNAUTH},
                {kClient, OK},
                {kOtherClient, OK},
                {kWorker, DENIED},
                {kOtherWorker, DENIED},
                {kAdmin, OK}});
  // bob's model: alice never uploaded it, so it is missing for her.
  ExpectMatrix(
      "SubmitJob(bob's model)",
      [&](Who who) { return Submit(who, JobRequest(bob_model, "cuda")); },
      {{kNone, UNAUTH},
       {kClient, NOT_FOUND},
       {kOtherClient, OK},
       {kWorker, DENIED},
       {kOtherWorker, DENIED},
       {kAdmin, OK}});
  const std::map<Who, grpc::StatusCode> owner_only = {
      {kNone, UNAUTH},   {kClient, OK},          {kOtherClient, NOT_FOUND},
      {kWorker, DENIED}, {kOtherWorker, DENIED}, {kAdmin, OK}};
  ExpectMatrix(
      "GetJob", [&](Who who) { return GetJob(who, job); }, owner_only);
  ExpectMatrix(
      "WatchJob", [&](Who who) { return Watch(who, job); }, owner_only);
  ExpectMatrix("ListJobs", [&](Who who) { return ListJobs(who); },
               {{kNone, UNAUTH},
                {kClient, OK},
                {kOtherClient, OK},
                {kWorker, DENIED},
                {kOtherWorker, DENIED},
                {kAdmin, OK}});
  ExpectMatrix("ListWorkers", [&](Who who) { return ListWorkers(who); },
               {{kNone, UNAUTH},
                {kClient, OK},
                {kOtherClient, OK},
                {kWorker, DENIED},
                {kOtherWorker, DENIED},
                {kAdmin, OK}});

  // ---- WorkerHub service, on the task of alice's job that w1 holds ----
  ExpectMatrix("RegisterWorker", [&](Who who) { return Register(who); },
               {{kNone, UNAUTH},
                {kClient, DENIED},
                {kOtherClient, DENIED},
                {kWorker, OK},
                {kOtherWorker, OK},
                {kAdmin, DENIED}});
  // Nothing else is queued for a CPU worker: the allowed leases are empty.
  ExpectMatrix("LeaseTask", [&](Who who) { return Lease(who, id_of(who)); },
               {{kNone, UNAUTH},
                {kClient, DENIED},
                {kOtherClient, DENIED},
                {kWorker, OK},
                {kOtherWorker, OK},
                {kAdmin, DENIED}});
  const std::map<Who, grpc::StatusCode> holder_only = {
      {kNone, UNAUTH}, {kClient, DENIED},      {kOtherClient, DENIED},
      {kWorker, OK},   {kOtherWorker, DENIED}, {kAdmin, DENIED}};
  ExpectMatrix(
      "Heartbeat", [&](Who who) { return Heartbeat(who, id_of(who), task); },
      holder_only);
  ExpectMatrix(
      "FetchModel(alice's model)",
      [&](Who who) { return Fetch(who, alice_model); }, holder_only);
  // w1 holds no lease on a task of bob's model.
  EXPECT_EQ(Fetch(kWorker, bob_model).error_code(), DENIED);
  // The other worker with the lease holder's exact fence token, under its
  // own id: the fence is bound to w1.
  EXPECT_EQ(FailTask(kOtherWorker, w2, task).error_code(), DENIED);
  EXPECT_EQ(ReportProfile(kOtherWorker, w2, task).error_code(), DENIED);
  EXPECT_EQ(Heartbeat(kOtherWorker, w2, task).error_code(), DENIED);
  // w1 fails its attempt (retryable) and leases the task again.
  ExpectMatrix(
      "FailTask", [&](Who who) { return FailTask(who, id_of(who), task); },
      holder_only);
  ASSERT_TRUE(Lease(kWorker, w1, &lease).ok());
  ASSERT_TRUE(lease.has_task());
  const v1::Task again = lease.task();
  ASSERT_GT(again.fence_token(), task.fence_token());
  ExpectMatrix(
      "ReportProfile",
      [&](Who who) { return ReportProfile(who, id_of(who), again); },
      holder_only);

  // ---- reads of the results, now that a profile exists ----
  ExpectMatrix(
      "GetProfile", [&](Who who) { return Profile(who, job); }, owner_only);
  ExpectMatrix(
      "GetSchedule", [&](Who who) { return Schedule(who, job); }, owner_only);

  // The validation w1 leases next: only w1 may report it.
  ASSERT_TRUE(Lease(kWorker, w1, &lease).ok());
  ASSERT_TRUE(lease.has_task());
  ASSERT_EQ(lease.task().kind(), v1::Task::VALIDATE);
  const v1::Task validate = lease.task();
  for (Who who : {kNone, kClient, kOtherClient, kOtherWorker, kAdmin}) {
    EXPECT_NE(ReportValidation(who, id_of(who), validate).error_code(), OK)
        << WhoName(who);
  }
  EXPECT_EQ(ReportValidation(kOtherWorker, w2, validate).error_code(), DENIED);
  const grpc::Status reported = ReportValidation(kWorker, w1, validate);
  EXPECT_TRUE(reported.ok()) << reported.error_message();
  // A training-loop report of the job's schedule: its owner or an admin.
  ExpectMatrix(
      "ReportTrainingLoop",
      [&](Who who) { return TrainingLoop(who, job, validate.schedule()); },
      owner_only);

  // Listing: each client sees its own jobs only, the admin every job.
  std::vector<std::string> alice_sees, bob_sees, root_sees;
  ASSERT_TRUE(ListJobs(kClient, &alice_sees).ok());
  ASSERT_TRUE(ListJobs(kOtherClient, &bob_sees).ok());
  ASSERT_TRUE(ListJobs(kAdmin, &root_sees).ok());
  EXPECT_THAT(alice_sees, ::testing::ElementsAre(job));
  EXPECT_THAT(bob_sees, ::testing::Contains(bob_job));
  EXPECT_THAT(bob_sees, Not(::testing::Contains(job)));
  EXPECT_THAT(root_sees, ::testing::IsSupersetOf({job, bob_job}));

  // Cancel last, on another unfinished job of alice's: the refused
  // identities first, then the admin, then the owner.
  std::string to_cancel;
  ASSERT_TRUE(
      Submit(kClient, JobRequest(alice_model, "cuda"), &to_cancel).ok());
  ExpectMatrix(
      "CancelJob", [&](Who who) { return Cancel(who, to_cancel); },
      {{kNone, UNAUTH},
       {kOtherClient, NOT_FOUND},
       {kWorker, DENIED},
       {kOtherWorker, DENIED},
       // The admin cancels it first; alice then finds it already cancelled.
       {kAdmin, OK},
       {kClient, grpc::StatusCode::FAILED_PRECONDITION}});
}

TEST_F(AuthTest, AnotherClientsJobLooksExactlyLikeAMissingOne) {
  StartServer(ServerOptions());
  ASSERT_TRUE(Upload(kClient, "model").ok());
  std::string job;
  ASSERT_TRUE(Submit(kClient, JobRequest("model"), &job).ok());
  const grpc::Status other = GetJob(kOtherClient, job);
  const grpc::Status missing = GetJob(kOtherClient, job + "x");
  EXPECT_EQ(other.error_code(), NOT_FOUND);
  EXPECT_EQ(other.error_message(), absl::StrCat("job \"", job, "\" not found"));
  EXPECT_EQ(missing.error_message(),
            absl::StrCat("job \"", job, "x\" not found"));
}

TEST_F(AuthTest, UploadingTheSameBytesLetsAClientUseTheModel) {
  StartServer(ServerOptions());
  ASSERT_TRUE(Upload(kOtherClient, "shared bytes").ok());
  EXPECT_EQ(Submit(kClient, JobRequest("shared bytes")).error_code(),
            NOT_FOUND);
  v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(kClient, "shared bytes", &response).ok());
  EXPECT_TRUE(response.already_stored());  // stored once, recorded twice
  std::string job;
  EXPECT_TRUE(Submit(kClient, JobRequest("shared bytes"), &job).ok());
}

TEST_F(AuthTest, ClientRequestIdsAreScopedToTheirOwner) {
  StartServer(ServerOptions());
  ASSERT_TRUE(Upload(kClient, "m").ok());
  ASSERT_TRUE(Upload(kOtherClient, "m").ok());
  auto request = JobRequest("m");
  request.set_client_request_id("run-1");
  std::string alice_job, bob_job, alice_again;
  ASSERT_TRUE(Submit(kClient, request, &alice_job).ok());
  // bob's retry-id collision neither returns alice's job nor fails.
  ASSERT_TRUE(Submit(kOtherClient, request, &bob_job).ok());
  ASSERT_TRUE(Submit(kClient, request, &alice_again).ok());
  EXPECT_NE(alice_job, bob_job);
  EXPECT_EQ(alice_job, alice_again);
}

TEST_F(AuthTest, AWorkerIdIsBoundToThePrincipalThatRegisteredIt) {
  StartServer(ServerOptions());
  std::string w1;
  ASSERT_TRUE(Register(kWorker, "", &w1).ok());
  // w2 cannot take over w1's live id, nor lease under it.
  const grpc::Status takeover = Register(kOtherWorker, w1);
  EXPECT_EQ(takeover.error_code(), DENIED) << takeover.error_message();
  EXPECT_EQ(Lease(kOtherWorker, w1).error_code(), DENIED);
  // w1 re-registering its own id is fine.
  std::string again;
  ASSERT_TRUE(Register(kWorker, w1, &again).ok());
  EXPECT_EQ(again, w1);
  EXPECT_TRUE(Lease(kWorker, w1).ok());
}

// Identity is per call, not per connection: on one channel, a call with
// alice's token, then one with none, then one with bob's, are alice,
// nobody and bob. (gRPC 1.51 shares the processor's AuthContext across a
// connection's calls; an identity kept there would carry over.)
TEST_F(AuthTest, IdentityIsPerCallOnOneConnection) {
  StartServer(ServerOptions());
  ASSERT_TRUE(Upload(kClient, "m").ok());
  std::string job;
  ASSERT_TRUE(Submit(kClient, JobRequest("m"), &job).ok());
  auto stub = v1::Planner::NewStub(grpc::CreateChannel(
      address_, grpc::experimental::LocalCredentials(LOCAL_TCP)));
  auto get = [&](const char* token) {
    grpc::ClientContext context;
    Deadline(context);
    if (token != nullptr) {
      context.set_credentials(grpc::AccessTokenCredentials(token));
    }
    v1::GetJobRequest request;
    request.set_job_id(job);
    v1::Job out;
    return stub->GetJob(&context, request, &out).error_code();
  };
  const std::string alice = Identities().at(kClient).second;
  const std::string bob = Identities().at(kOtherClient).second;
  EXPECT_EQ(get(alice.c_str()), OK);
  EXPECT_EQ(get(nullptr), UNAUTH);
  EXPECT_EQ(get(bob.c_str()), NOT_FOUND);
  EXPECT_EQ(get(alice.c_str()), OK);
  EXPECT_EQ(get(nullptr), UNAUTH);
}

// The token check runs before any service: gRPC's own (reflection) and a
// method that does not exist are refused without a token; with one they get
// past it (and reach their handler, or UNIMPLEMENTED).
TEST_F(AuthTest, EveryServiceButHealthNeedsAToken) {
  StartServer(ServerOptions());
  auto call = [&](Who who, const std::string& method) {
    grpc::GenericStub stub(Channel(who));
    grpc::ClientContext context;
    Deadline(context);
    grpc::Slice empty("");  // an empty message, valid for any method
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(s); });
    return done.get_future().get().error_code();
  };
  const std::string reflection =
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  EXPECT_EQ(call(kNone, reflection), UNAUTH);
  EXPECT_NE(call(kClient, reflection), UNAUTH);
  EXPECT_EQ(call(kNone, "/mutwo.v1.Planner/NoSuchMethod"), UNAUTH);
  EXPECT_EQ(call(kClient, "/mutwo.v1.Planner/NoSuchMethod"),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(AuthTest, AnInvalidTokenIsRefusedAndHealthNeedsNone) {
  MutwoServer::Options options = ServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  StartServer(options);
  WriteFile(dir_ / "bad", "not-a-token-the-server-knows\n");
  ClientCredentialsOptions bad;
  bad.target = address_;
  bad.token_file = (dir_ / "bad").string();
  bad.use_environment = false;
  auto channel = grpc::CreateChannel(address_, *MakeChannelCredentials(bad));
  grpc::ClientContext context;
  Deadline(context);
  v1::ListJobsResponse response;
  const grpc::Status s = v1::Planner::NewStub(channel)->ListJobs(
      &context, v1::ListJobsRequest(), &response);
  EXPECT_EQ(s.error_code(), UNAUTH);
  EXPECT_THAT(s.error_message(), Not(HasSubstr("not-a-token")));
  // Counted by reason, for alerts on guessing or a stale worker token.
  EXPECT_THAT(
      testing::HttpGet(server_->metrics_port(), "/metrics"),
      HasSubstr("mutwo_auth_refusals_total{reason=\"invalid_token\"} 1"));

  // Health needs no token (probes), and a valid one does no harm.
  for (Who who : {kNone, kClient}) {
    grpc::ClientContext health_context;
    Deadline(health_context);
    grpc::health::v1::HealthCheckResponse health;
    const grpc::Status h =
        grpc::health::v1::Health::NewStub(Channel(who))
            ->Check(&health_context, grpc::health::v1::HealthCheckRequest(),
                    &health);
    EXPECT_TRUE(h.ok()) << WhoName(who) << ": " << h.error_message();
    EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

// Without a tokens file (loopback only) the server is open as before: every
// caller is an admin named '' and may call everything.
TEST_F(AuthTest, WithoutTokensOnLoopbackEveryCallerIsAdmin) {
  MutwoServer::Options options = ServerOptions();
  options.security.tokens_file.clear();
  StartServer(options);
  ASSERT_TRUE(Upload(kNone, "m").ok());
  std::string job, w;
  ASSERT_TRUE(Submit(kNone, JobRequest("m"), &job).ok());
  EXPECT_TRUE(GetJob(kNone, job).ok());
  ASSERT_TRUE(Register(kNone, "", &w).ok());
  v1::LeaseTaskResponse lease;
  ASSERT_TRUE(Lease(kNone, w, &lease).ok());
  ASSERT_TRUE(lease.has_task());
  EXPECT_TRUE(Fetch(kNone, "m").ok());
  // The fence stays bound to the worker id that holds the lease.
  std::string other;
  ASSERT_TRUE(Register(kNone, "", &other).ok());
  EXPECT_EQ(ReportProfile(kNone, other, lease.task()).error_code(), DENIED);
  EXPECT_TRUE(ReportProfile(kNone, w, lease.task()).ok());
}

TEST_F(AuthTest, RefusesToStartOpenOrWithClearTextTokensOffLoopback) {
  MutwoServer::Options open = ServerOptions();
  open.security.tokens_file.clear();
  open.listen = "0.0.0.0:0";
  auto refused = MutwoServer::Create(open);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("--insecure"));
  open.security.insecure = true;
  EXPECT_TRUE(MutwoServer::Create(open).ok());

  MutwoServer::Options clear = ServerOptions();
  clear.listen = "0.0.0.0:0";
  auto clear_refused = MutwoServer::Create(clear);
  ASSERT_FALSE(clear_refused.ok());
  EXPECT_THAT(clear_refused.status().message(), HasSubstr("--tls_cert"));
  clear.security.insecure = true;  // contradicts the tokens file
  auto contradiction = MutwoServer::Create(clear);
  ASSERT_FALSE(contradiction.ok());
  EXPECT_THAT(contradiction.status().message(), HasSubstr("contradicts"));

  MutwoServer::Options half_tls = ServerOptions();
  half_tls.security.tls_cert_file = (dir_ / "cert.pem").string();
  EXPECT_FALSE(MutwoServer::Create(half_tls).ok());
}

// Certificates made for the test with the openssl CLI: a CA, a server
// certificate for 127.0.0.1 and localhost, client certificates w1 and w2
// for mTLS, and an unrelated CA.
class TlsTest : public AuthTest {
 protected:
  void SetUp() override {
    AuthTest::SetUp();
    const std::string d = dir_.string();
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";
    auto run = [](const std::string& command) {
      auto r = testing::RunCommand(command);
      ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    };
    for (const std::string ca : {"ca", "other_ca"}) {
      run(absl::StrCat("openssl req -x509 ", key, " -nodes -keyout ", d, "/",
                       ca, ".key -out ", d, "/", ca,
                       ".pem -days 2 -subj /CN=mutwo-test-", ca));
    }
    WriteFile(dir_ / "san.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    for (const std::string name : {"server", "w1", "w2"}) {
      run(absl::StrCat("openssl req ", key, " -nodes -keyout ", d, "/", name,
                       ".key -out ", d, "/", name, ".csr -subj /CN=", name));
      run(absl::StrCat(
          "openssl x509 -req -in ", d, "/", name, ".csr -CA ", d,
          "/ca.pem -CAkey ", d, "/ca.key -CAcreateserial -out ", d, "/", name,
          ".pem -days 2",
          name == "server" ? absl::StrCat(" -extfile ", d, "/san.ext") : ""));
    }
  }

  MutwoServer::Options TlsOptions() {
    MutwoServer::Options options = ServerOptions();
    options.security.tls_cert_file = (dir_ / "server.pem").string();
    options.security.tls_key_file = (dir_ / "server.key").string();
    return options;
  }

  ClientCredentialsOptions Tls(const std::string& ca = "ca",
                               const std::string& cert = "") {
    ClientCredentialsOptions o;
    o.tls_ca_file = (dir_ / (ca + ".pem")).string();
    if (!cert.empty()) {
      o.tls_cert_file = (dir_ / (cert + ".pem")).string();
      o.tls_key_file = (dir_ / (cert + ".key")).string();
    }
    return o;
  }

  grpc::Status ListJobsOver(std::shared_ptr<grpc::Channel> channel) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::ListJobsResponse response;
    return v1::Planner::NewStub(channel)->ListJobs(
        &context, v1::ListJobsRequest(), &response);
  }

  grpc::Status RegisterOver(std::shared_ptr<grpc::Channel> channel) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::RegisterWorkerRequest request;
    request.mutable_worker()->mutable_device()->set_kind("cpu");
    v1::RegisterWorkerResponse response;
    return v1::WorkerHub::NewStub(channel)->RegisterWorker(&context, request,
                                                           &response);
  }
};

TEST_F(TlsTest, TokensWorkOverTlsAndPlainOrWronglyVerifiedClientsAreRefused) {
  StartServer(TlsOptions());
  // The CA that signed the server's certificate, with alice's token.
  EXPECT_TRUE(ListJobsOver(Channel(kClient, Tls())).ok());
  // TLS without a token: the handshake works, the RPC needs a token.
  EXPECT_EQ(ListJobsOver(Channel(kNone, Tls())).error_code(), UNAUTH);
  // No TLS at all (plain, or a token over local credentials): no handshake.
  EXPECT_EQ(ListJobsOver(Channel(kNone)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ListJobsOver(Channel(kClient)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A CA that did not sign the server's certificate: not verified.
  EXPECT_EQ(ListJobsOver(Channel(kClient, Tls("other_ca"))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, WithAClientCaAWorkerNeedsItsOwnCertificate) {
  MutwoServer::Options options = TlsOptions();
  options.security.tls_client_ca_file = (dir_ / "ca.pem").string();
  StartServer(options);
  EXPECT_TRUE(RegisterOver(Channel(kWorker, Tls("ca", "w1"))).ok());
  // The worker token alone, or with another worker's certificate: refused.
  EXPECT_EQ(RegisterOver(Channel(kWorker, Tls())).error_code(), UNAUTH);
  EXPECT_EQ(RegisterOver(Channel(kWorker, Tls("ca", "w2"))).error_code(),
            UNAUTH);
  // Clients need no certificate.
  EXPECT_TRUE(ListJobsOver(Channel(kClient, Tls())).ok());
}

}  // namespace
}  // namespace mutwo
