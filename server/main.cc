// mutwo-server: parses flags, starts the server, waits for SIGTERM/SIGINT on
// a dedicated sigwait thread, then drains and exits 0.
#include <csignal>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/args.h"
#include "common/logging.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address");
ABSL_FLAG(std::string, data_dir, "./mutwo-data",
          "directory for the SQLite database and model files");
ABSL_FLAG(int32_t, drain_timeout_ms, 10000,
          "on SIGTERM, how long in-flight RPCs may take before cancellation");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");

namespace {
constexpr char kUsage[] =
    "mutwo-server: the mutwo planning service (gRPC).\n\n"
    "Usage: mutwo-server [--listen=HOST:PORT] [--data_dir=DIR] [flags]";
}

int main(int argc, char** argv) {
  auto args = mutwo::ParseArgs(argc, argv, 1, {});
  if (!args.ok()) {
    std::cerr << "mutwo-server: " << args.status().message() << "\n";
    return mutwo::kExitBadInput;
  }
  if (args->help) {
    std::cout << mutwo::UsageWithFlags(kUsage);
    return mutwo::kExitOk;
  }
  if (!args->positional.empty()) {
    std::cerr << "mutwo-server: unexpected argument \"" << args->positional[0]
              << "\"; see --help\n";
    return mutwo::kExitBadInput;
  }
  if (auto s =
          mutwo::InitLogging("mutwo-server", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::cerr << "mutwo-server: " << s.message() << "\n";
    return mutwo::kExitBadInput;
  }
  // Block the signals before any thread starts so only sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  mutwo::MutwoServer::Options options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  auto server = mutwo::MutwoServer::Create(options);
  if (!server.ok()) {
    MUTWO_LOG(error, "{}", server.status().ToString());
    return mutwo::kExitBadInput;
  }
  if (auto s = (*server)->Start(); !s.ok()) {
    MUTWO_LOG(error, "{}", s.ToString());
    return mutwo::kExitFailure;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  MUTWO_LOG(info, "signal {}: draining", sig);
  (*server)->Shutdown(
      absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
  MUTWO_LOG(info, "stopped");
  return mutwo::kExitOk;
}
