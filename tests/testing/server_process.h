// Test helper: mutwo-server as a real process on loopback, for the tests
// that drive it through the binaries (the CLI, workers) or kill it
// (service_e2e_test, cli_server_test, auth_process_test, sigterm_drain_test,
// crash_restart_test, rss_soak_test), on ports found free at run time.
//
// Ownership: the caller's Subprocess owns the process (its destructor or
// Kill stops it); the data and the log stay in the caller's directory.
// Thread safety: as Subprocess (one test thread).
// Errors: false / nullopt when the process could not be started or did not
// become ready; its log says why.
#ifndef MUTWO_TESTS_TESTING_SERVER_PROCESS_H_
#define MUTWO_TESTS_TESTING_SERVER_PROCESS_H_

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/command.h"
#include "tests/testing/process.h"

namespace mutwo::testing {

// Starts `server` as mutwo-server listening on `address` (host:port), its
// /metrics on 127.0.0.1:`metrics_port`, its data in dir/data and its log in
// dir/server.log, with `extra` flags after those.
inline bool StartMutwoServer(Subprocess& server, const std::string& address,
                             int metrics_port, const std::filesystem::path& dir,
                             const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {
      BinPath("mutwo-server"), "--listen=" + address,
      absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port),
      "--data_dir=" + (dir / "data").string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return server.Start(argv, (dir / "server.log").string());
}

// The loopback ports one start of mutwo-server listens on: gRPC on `port`,
// /metrics on `metrics_port` (a test that wants no /metrics ignores it).
struct ServerPorts {
  int port = 0;
  int metrics_port = 0;
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
};

// Starts mutwo-server with `start(server, ports)` on ports FreePort() found
// and polls `ready(ports)` (a quick check that it serves: a channel that
// connects within a moment, `mutwo health`) for up to 10 s while the
// process runs. A port FreePort() found free may be taken by a test running
// beside this one before the server binds it; the server then exits, its
// log saying the port is already in use, and the start is tried again on
// other ports, at most `attempts` times in all. Returns the ports of the
// start that became ready; nullopt when `start` failed, or when the server
// exited for another reason or did not become ready (not a port race: the
// caller reports server.Log()). A test whose server must come back on the
// same port (clients or workers hold its address) restarts it there itself.
// `pick_port` finds each port (a test of this helper hands it a taken one).
inline std::optional<ServerPorts> StartOnFreePorts(
    Subprocess& server,
    const std::function<bool(Subprocess&, const ServerPorts&)>& start,
    const std::function<bool(const ServerPorts&)>& ready, int attempts = 3,
    const std::function<int()>& pick_port = FreePort) {
  for (int attempt = 0; attempt < attempts; ++attempt) {
    ServerPorts ports;
    ports.port = pick_port();
    ports.metrics_port = pick_port();
    if (!start(server, ports)) return std::nullopt;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server.Exited() && std::chrono::steady_clock::now() < deadline) {
      // (Ready, and still ours: a server that lost its port to another
      // server may have answered for it until this one exited.)
      if (ready(ports) && !server.Exited()) return ports;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!server.Exited() ||
        server.Log().find("already in use") == std::string::npos) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// StartMutwoServer on ports found free, tried again on others when a port
// was lost to a parallel test (StartOnFreePorts), ready when `ready` says.
inline std::optional<ServerPorts> StartMutwoServerOnFreePorts(
    Subprocess& server, const std::filesystem::path& dir,
    const std::vector<std::string>& extra,
    const std::function<bool(const ServerPorts&)>& ready) {
  return StartOnFreePorts(
      server,
      [&](Subprocess& s, const ServerPorts& ports) {
        return StartMutwoServer(s, ports.address(), ports.metrics_port, dir,
                                extra);
      },
      ready);
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_SERVER_PROCESS_H_
