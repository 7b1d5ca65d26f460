#include "worker/cli.h"

#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_replace.h"
#include "common/args.h"
#include "common/logging.h"
#include "worker/execute_command.h"
#include "worker/profile_command.h"
#include "worker/task_commands.h"

ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");

namespace mutwo {
namespace {

constexpr char kUsage[] =
    "mutwo-worker: profiles and executes training steps with LibTorch.\n\n"
    "Usage: mutwo-worker COMMAND [ARGS] [flags]\n\n"
    "Commands:\n"
    "  version   print the LibTorch version and the devices it sees\n"
    "%PROFILE%"
    "%EXECUTE%\n"
    "  serve --server=HOST:PORT [--device=cpu|cuda:N] [--metrics_listen=...]\n"
    "            [--work_dir=DIR] [--task_memory_limit=16GiB]\n"
    "            the worker daemon: lease tasks from mutwo-server, run each\n"
    "            in a child process with limits, report the results\n"
    "  run-task  (used by serve) run one leased task file\n"
    "  device-info [--device=...]   the device facts as JSON\n"
    "Exit codes: 0 ok, 1 failed (execute: measured over the budget, out of\n"
    "memory or not matching the unmodified step), 2 bad input, 3 infeasible\n"
    "(execute: a schedule marked infeasible, without --force).";

int Version(const ParsedArgs&) {
  std::cout << "libtorch " << TORCH_VERSION << "\n";
  std::cout << "cuda available: "
            << (torch::cuda::is_available() ? "yes" : "no")
            << ", devices: " << static_cast<int>(torch::cuda::device_count())
            << "\n";
  return kExitOk;
}

}  // namespace

int RunWorkerCli(int argc, char** argv) {
  const std::map<std::string, std::function<int(const ParsedArgs&)>> commands =
      {{"version", Version},
       {"profile", worker::RunProfileCommand},
       {"execute", worker::RunExecuteCommand},
       {"serve",
        [argv](const ParsedArgs& a) {
          return worker::RunServeCommand(a, argv[0]);
        }},
       {"run-task", worker::RunTaskCommand},
       {"device-info", worker::RunDeviceInfoCommand}};
  auto args = ParseArgs(argc, argv, 1, {"input"});
  if (!args.ok()) {
    std::cerr << "mutwo-worker: " << args.status().message() << "\n";
    return kExitBadInput;
  }
  if (args->help || args->positional.empty()) {
    (args->help ? std::cout : std::cerr) << UsageWithFlags(
        absl::StrReplaceAll(kUsage, {{"%PROFILE%", worker::kProfileUsage},
                                     {"%EXECUTE%", worker::kExecuteUsage}}));
    return args->help ? kExitOk : kExitBadInput;
  }
  const std::string name = args->positional.front();
  auto it = commands.find(name);
  if (it == commands.end()) {
    std::cerr << "mutwo-worker: unknown command \"" << name
              << "\"; see mutwo-worker --help\n";
    return kExitBadInput;
  }
  if (auto s = InitLogging("mutwo-worker", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::cerr << "mutwo-worker: " << s.message() << "\n";
    return kExitBadInput;
  }
  args->positional.erase(args->positional.begin());
  return it->second(*args);
}

}  // namespace mutwo
