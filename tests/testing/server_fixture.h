// Test fixture: an in-process MutwoServer on a loopback port (chosen at run
// time) with a temporary data directory and, when a test gives identities,
// a tokens file and one token file per identity. The calls tests make of it
// are in grpc_calls.h. Shared by the tests that
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
#include "tests/testing/grpc_calls.h"

namespace mutwo::testing {

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

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_SERVER_FIXTURE_H_
