// Test fixture: an in-process MutwoServer on a loopback port (chosen at run
// time) with a temporary data directory and, when a test gives identities,
// a tokens file and one token file per identity. Shared by the tests that
// call the server over gRPC as several principals (auth_test,
// tenant_isolation_test) or without authentication (long_wait_test).
//
// Ownership: the fixture owns the server and the directory; TearDown shuts
// the server down and removes the directory. A test that keeps calls open
// cancels them before calling InProcessServerTest::TearDown.
// Thread safety: as any GoogleTest fixture (the test's thread).
// Errors: set-up failures are test failures (ASSERT/EXPECT), never thrown.
#ifndef MUTWO_TESTS_TESTING_SERVER_FIXTURE_H_
#define MUTWO_TESTS_TESTING_SERVER_FIXTURE_H_

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>

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

namespace mutwo::testing {

// A deadline `ms` from now.
inline std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// Identity -> ("ROLE PRINCIPAL", token), as the tokens file names them.
using Identities = std::map<int, std::pair<std::string, std::string>>;

class InProcessServerTest : public ::testing::Test {
 protected:
  // `name`: the temp directory's prefix (one directory per test).
  explicit InProcessServerTest(std::string name) : name_(std::move(name)) {}

  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat(
               "mutwo_", name_, "_", getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Writes tokens.txt (`header` first, then one "ROLE PRINCIPAL sha256:HEX"
  // line per identity; the file holds only the hashes) and each identity's
  // token to TokenFile(who).
  void WriteTokens(const Identities& ids, const std::string& header = "") {
    std::string tokens = header;
    for (const auto& [who, id] : ids) {
      absl::StrAppend(&tokens, id.first, " ", auth::TokenHashField(id.second),
                      "\n");
      std::ofstream(TokenFile(who), std::ios::binary) << id.second << "\n";
    }
    std::ofstream(dir_ / "tokens.txt", std::ios::binary) << tokens;
    with_tokens_ = true;
  }
  std::string TokenFile(int who) const {
    return (dir_ / absl::StrCat("token", who)).string();
  }

  // Loopback, an ephemeral port, no metrics port, the data directory, the
  // tokens file when WriteTokens ran, the real planner (5 Pareto points).
  MutwoServer::Options ServerOptions() const {
    MutwoServer::Options options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.data_dir = (dir_ / "data").string();
    if (with_tokens_) {
      options.security.tokens_file = (dir_ / "tokens.txt").string();
    }
    options.plan = PlannerPlanFn(5);
    options.max_batch = PlannerMaxBatchFn();
    return options;
  }

  void StartServer(MutwoServer::Options options) {
    auto server = MutwoServer::Create(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->Start().ok());
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  // A new channel to the server with the token in `token_file` (empty: no
  // token); `base` carries the other credential options.
  std::shared_ptr<grpc::Channel> NewChannel(
      const std::string& token_file, ClientCredentialsOptions base = {}) {
    base.target = address_;
    base.use_environment = false;
    base.token_file = token_file;
    auto credentials = MakeChannelCredentials(base);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return grpc::CreateChannel(address_, *credentials);
  }

  std::filesystem::path dir_;
  std::unique_ptr<MutwoServer> server_;
  std::string address_;

 private:
  std::string name_;
  bool with_tokens_ = false;
};

// Uploads `bytes` in one chunk (named "m").
inline grpc::Status UploadModel(v1::Planner::Stub& planner,
                                const std::string& bytes,
                                v1::UploadModelResponse* out = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(In(10000));
  v1::UploadModelResponse response;
  auto writer = planner.UploadModel(&context, &response);
  v1::UploadModelRequest header;
  header.mutable_header()->set_sha256(Sha256Hex(bytes));
  header.mutable_header()->set_size_bytes(bytes.size());
  header.mutable_header()->set_name("m");
  writer->Write(header);
  v1::UploadModelRequest chunk;
  chunk.set_chunk(bytes);
  writer->Write(chunk);
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (out != nullptr) *out = response;
  return status;
}

// A job for the model `model_bytes` (named "chain"): input x:float32[B,16],
// batch size 8, budget 60%, on `device_kind` (empty: any).
inline v1::SubmitJobRequest ChainJobRequest(const std::string& model_bytes,
                                            const std::string& device_kind) {
  v1::SubmitJobRequest r;
  auto* spec = r.mutable_spec();
  spec->set_model_sha256(Sha256Hex(model_bytes));
  spec->set_model_name("chain");
  *spec->add_inputs() = *ParseTensorSpec("x:float32[B,16]");
  spec->add_batch_sizes(8);
  *spec->add_budgets() = *ParseBudget("60%");
  spec->set_device_kind(device_kind);
  return r;
}

// Registers a CPU worker (worker id `worker_id`, empty: the server picks
// one) and returns the status; `*out` gets the id.
inline grpc::Status RegisterCpuWorker(v1::WorkerHub::Stub& hub,
                                      const std::string& worker_id = "",
                                      std::string* out = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(In(10000));
  v1::RegisterWorkerRequest request;
  request.mutable_worker()->set_worker_id(worker_id);
  request.mutable_worker()->mutable_device()->set_kind("cpu");
  request.mutable_worker()->mutable_device()->set_name("cpu");
  v1::RegisterWorkerResponse response;
  grpc::Status s = hub.RegisterWorker(&context, request, &response);
  if (out != nullptr) *out = response.worker_id();
  return s;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_SERVER_FIXTURE_H_
