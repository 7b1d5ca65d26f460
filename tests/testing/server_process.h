// Test helper: mutwo-server as a real process on loopback, for the tests
// that drive it through the binaries (the CLI, workers): service_e2e_test,
// cli_server_test.
//
// Ownership: the caller's Subprocess owns the process (its destructor or
// Kill stops it); the data and the log stay in the caller's directory.
// Thread safety: as Subprocess (one test thread).
// Errors: false when the process could not be started; whether it then
// serves is the caller's to wait for (its log says why not).
#ifndef MUTWO_TESTS_TESTING_SERVER_PROCESS_H_
#define MUTWO_TESTS_TESTING_SERVER_PROCESS_H_

#include <filesystem>
#include <string>
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

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_SERVER_PROCESS_H_
