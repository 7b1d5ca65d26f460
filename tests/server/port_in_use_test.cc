// A second mutwo-server on a port already bound must refuse to start. gRPC
// sets SO_REUSEPORT on its listeners by default, so without the server
// turning it off a second server bound the same port silently and the kernel
// split the traffic between two servers with two databases. The attack is
// the test: start two real servers on one port.
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace mutwo {
namespace {

using testing::BinPath;
using testing::FreePort;
using testing::Subprocess;

class PortInUseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("port_in_use_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    port_ = FreePort();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  bool StartServer(Subprocess& server, const std::string& name,
                   const std::string& metrics_listen = "") {
    return server.Start(
        {BinPath("mutwo-server"), absl::StrCat("--listen=127.0.0.1:", port_),
         "--metrics_listen=" + metrics_listen,
         "--data_dir=" + (dir_ / name).string()},
        (dir_ / (name + ".log")).string());
  }

  // Lists jobs through a fresh channel: the server that answers it holds
  // the port.
  grpc::Status ListJobs() {
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Planner::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    v1::ListJobsResponse response;
    return stub->ListJobs(&ctx, v1::ListJobsRequest(), &response);
  }

  std::filesystem::path dir_;
  int port_ = 0;
};

TEST_F(PortInUseTest, SecondServerOnABoundPortExitsTwoNamingThePort) {
  Subprocess first;
  ASSERT_TRUE(StartServer(first, "first"));
  ASSERT_TRUE(ListJobs().ok()) << first.Log();

  Subprocess second;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(StartServer(second, "second"));
  const int code = second.Wait(std::chrono::seconds(10));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(code, 2) << "the second server kept running or exited otherwise: "
                     << second.Log();
  EXPECT_NE(
      second.Log().find(absl::StrCat("port ", port_, " is already in use")),
      std::string::npos)
      << second.Log();
  // The first server still holds the port alone and answers.
  EXPECT_TRUE(first.running());
  EXPECT_TRUE(ListJobs().ok());
  std::cout << "{\"test\":\"port_in_use\",\"port\":" << port_
            << ",\"exit_code\":" << code << ",\"exit_seconds\":" << seconds
            << "}\n";
  first.Kill(SIGTERM);
  EXPECT_EQ(first.Wait(std::chrono::seconds(30)), 0) << first.Log();
}

TEST_F(PortInUseTest, PortHeldByAnotherProgramExitsTwoNamingThePort) {
  // Any listener, not only a mutwo-server: a plain socket without
  // SO_REUSEPORT.
  const testing::OccupiedPort taken;
  port_ = taken.port();
  Subprocess server;
  ASSERT_TRUE(StartServer(server, "only"));
  EXPECT_EQ(server.Wait(std::chrono::seconds(10)), 2) << server.Log();
  EXPECT_NE(
      server.Log().find(absl::StrCat("port ", port_, " is already in use")),
      std::string::npos)
      << server.Log();
}

// The metrics port is the operator's choice as much as --listen: taken, the
// server exits 2 naming it, as for the gRPC port (it exited 1 before).
TEST_F(PortInUseTest, MetricsPortHeldByAnotherProgramExitsTwoNamingThePort) {
  const testing::OccupiedPort taken;
  const int metrics_port = taken.port();
  Subprocess server;
  ASSERT_TRUE(
      StartServer(server, "metrics", absl::StrCat("127.0.0.1:", metrics_port)));
  EXPECT_EQ(server.Wait(std::chrono::seconds(10)), 2) << server.Log();
  EXPECT_NE(server.Log().find(
                absl::StrCat("port ", metrics_port, " is already in use")),
            std::string::npos)
      << server.Log();
  EXPECT_NE(server.Log().find("--metrics_listen"), std::string::npos)
      << server.Log();
}

// Whether a server answers on `p` within a moment (a plain socket holding
// the port accepts the connection but never speaks HTTP/2).
bool Connects(const testing::ServerPorts& p) {
  return grpc::CreateChannel(p.address(), grpc::InsecureChannelCredentials())
      ->WaitForConnected(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(250));
}

// The server-process tests start mutwo-server through StartOnFreePorts: a
// start whose port a parallel test took first is tried again on other
// ports, and the ports it returns are those of the server that serves.
TEST_F(PortInUseTest, AStartThatLostItsPortIsTriedOnOthers) {
  const testing::OccupiedPort taken;
  int picks = 0;
  Subprocess server;
  const auto ports = testing::StartOnFreePorts(
      server,
      [&](Subprocess& s, const testing::ServerPorts& p) {
        port_ = p.port;
        return StartServer(s, "retried");
      },
      Connects, /*attempts=*/3,
      [&] { return picks++ == 0 ? taken.port() : FreePort(); });
  ASSERT_TRUE(ports.has_value()) << server.Log();
  EXPECT_NE(ports->port, taken.port());
  EXPECT_EQ(picks, 4) << "one retry: two ports a start";
  EXPECT_NE(server.Log().find(
                absl::StrCat("port ", taken.port(), " is already in use")),
            std::string::npos)
      << server.Log();
  port_ = ports->port;
  EXPECT_TRUE(ListJobs().ok());
}

// A start that fails for another reason is reported at once, not retried.
TEST_F(PortInUseTest, AStartThatFailsForAnotherReasonIsNotRetried) {
  int picks = 0;
  Subprocess server;
  const auto ports = testing::StartOnFreePorts(
      server,
      [&](Subprocess& s, const testing::ServerPorts& p) {
        return s.Start({BinPath("mutwo-server"), "--listen=" + p.address(),
                        "--metrics_listen=", "--data_dir="},
                       (dir_ / "refused.log").string());
      },
      Connects, /*attempts=*/3,
      [&] {
        ++picks;
        return FreePort();
      });
  EXPECT_FALSE(ports.has_value());
  EXPECT_EQ(picks, 2);
  EXPECT_NE(server.Log().find("--data_dir"), std::string::npos) << server.Log();
}

}  // namespace
}  // namespace mutwo
