#include "worker/cli.h"

#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/args.h"
#include "common/command_table.h"
#include "common/logging.h"
#include "worker/execute_command.h"
#include "worker/profile_command.h"
#include "worker/task_commands.h"

ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off");
ABSL_DECLARE_FLAG(std::string, device);

namespace mutwo {
namespace {

std::string TorchVersion() {
  return absl::StrCat("libtorch ", TORCH_VERSION, "\n");
}

int Version(const ParsedArgs&) {
  std::cout << VersionLine("mutwo-worker") << "\n" << TorchVersion();
  std::cout << "cuda available: "
            << (torch::cuda::is_available() ? "yes" : "no")
            << ", devices: " << static_cast<int>(torch::cuda::device_count())
            << "\n";
  return kExitOk;
}

// The training-step flags `profile` and `execute` share.
const std::vector<std::string> kStepFlags = {
    "input",     "unbatched",    "batch",  "loss",
    "optimizer", "device",       "warmup", "iterations",
    "seed",      "memory_limit", "output", "specialize_control_flow"};

std::vector<std::string> StepFlags(std::vector<std::string> more) {
  std::vector<std::string> flags = kStepFlags;
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

std::vector<CommandSpec> Commands(const char* argv0) {
  return {
      {"profile",
       "MODEL.pt --input NAME:DTYPE[B,...]{lo,hi} [--input ...] --batch N "
       "[flags]",
       "profile one training step: time and memory per node, activations",
       "Prints a summary for people; --output json prints the whole Profile "
       "(what\n`mutwo plan` reads), --output csv the nodes and activations. "
       "An input spec\nwithout B is refused unless --unbatched names it. Out "
       "of memory is a result\n(oom: true), exit 0.",
       StepFlags({}),
       {},
       worker::RunProfileCommand},
      {"execute",
       "MODEL.pt --schedule SCHEDULE.json --input ... [--batch N] [flags]",
       "run training steps with a schedule, checked against plain steps",
       "Exit 1 (after the result) when the measured peak exceeds the budget, "
       "the step\nran out of memory or gradients, loss or batch-norm "
       "statistics differ; exit 3\nfor a schedule marked infeasible (run it "
       "with --force).",
       StepFlags({"schedule", "baseline", "force", "trace_dir"}),
       {{"batch", "the batch size substituted for B (default: the schedule's)"},
        {"output", "text or json (the Validation, for scripts)"}},
       worker::RunExecuteCommand},
      {"serve",
       "--server=HOST:PORT [--device=cpu|cuda:N] [--metrics_listen=...] "
       "[flags]",
       "the worker daemon: lease tasks from mutwo-server and run them",
       "",
       {"server", "device", "metrics_listen", "work_dir", "task_memory_limit",
        "task_time_limit_ms", "max_tasks", "token_file", "tls_ca", "tls_cert",
        "tls_key", "specialize_control_flow"},
       // The flags' own help (worker/task_commands.cc) is written for the
       // global list; here it needs no "serve:" in front.
       {{"server", "mutwo-server address"},
        {"metrics_listen", "Prometheus /metrics address; empty: off"},
        {"work_dir",
         "model cache and task files (default: $XDG_CACHE_HOME/mutwo/worker, "
         "else ~/.cache/mutwo/worker, else /tmp/mutwo-worker-UID)"},
        {"task_memory_limit",
         "address-space limit of each CPU task process, e.g. 16GiB; auto: "
         "half the machine's memory; none: no limit"},
        {"task_time_limit_ms", "wall-clock limit of one task process"},
        {"max_tasks", "exit after this many tasks; 0: never"},
        {"token_file",
         "file holding the worker's bearer token (or MUTWO_TOKEN_FILE, "
         "MUTWO_TOKEN)"},
        {"tls_ca", "PEM CA to verify the server (TLS; or MUTWO_TLS_CA)"},
        {"tls_cert", "PEM client certificate (mTLS), with --tls_key"},
        {"tls_key", "PEM private key of --tls_cert"},
        {"specialize_control_flow",
         "profile and execute tasks with the graph specialised to the "
         "branches the step takes (see `profile --help`); every worker of a "
         "server must agree"}},
       [argv0](const ParsedArgs& a) {
         return worker::RunServeCommand(a, argv0);
       }},
      {"run-task",
       "--task_file=F --model_file=F --result_file=F",
       "(used by serve) run one leased task file",
       "",
       {"task_file", "model_file", "result_file", "device",
        "specialize_control_flow"},
       {{"task_file", "the task written by serve"},
        {"model_file", "the model file"},
        {"result_file", "where to write the result"}},
       worker::RunTaskCommand},
      {"device-info",
       "[--device=cpu|cuda:N] [--result_file=F]",
       "the device facts as JSON (used by serve)",
       "",
       {"device", "result_file"},
       {{"result_file", "write the JSON here instead of stdout"}},
       worker::RunDeviceInfoCommand},
      {"version",
       "",
       "the versions and the devices LibTorch sees",
       "",
       {},
       {},
       Version},
  };
}

}  // namespace

int RunWorkerCli(int argc, char** argv) {
  CommandTableOptions options;
  options.program = "mutwo-worker";
  options.description =
      "mutwo-worker: profiles and executes training steps with LibTorch.";
  options.footer =
      "Exit codes: 0 ok, 1 failed (execute: measured over the budget, out of "
      "memory\nor not matching the unmodified step), 2 bad input, 3 "
      "infeasible (execute: a\nschedule marked infeasible, without --force).";
  options.global_flags = {"log_level"};
  options.parse.repeated = {"input", "unbatched", "loss"};
  options.version_extra = TorchVersion;
  options.before_run = [](const CommandSpec& command) -> absl::Status {
    // Device names in any case: --device CUDA:0.
    absl::SetFlag(&FLAGS_device,
                  absl::AsciiStrToLower(absl::GetFlag(FLAGS_device)));
    return InitLogging("mutwo-worker", absl::GetFlag(FLAGS_log_level));
  };
  const CommandTable table(std::move(options), Commands(argv[0]));
  return table.Run(argc, argv);
}

}  // namespace mutwo
