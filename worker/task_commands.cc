#include "worker/task_commands.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flag_values.h"
#include "common/logging.h"
#include "common/metrics_exposer.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/server_address.h"
#include "mutwo/v1/worker_hub.pb.h"
#include "worker/daemon/child_process.h"
#include "worker/daemon/daemon.h"
#include "worker/executor.h"
#include "worker/memory.h"
#include "worker/profile_command.h"
#include "worker/profiler.h"

ABSL_FLAG(std::string, server, "",
          "serve: mutwo-server address (default: $MUTWO_SERVER, else "
          "127.0.0.1:50051)");
ABSL_FLAG(std::string, token_file, "",
          "serve: file whose first line is the worker's bearer token (else "
          "MUTWO_TOKEN_FILE, else MUTWO_TOKEN)");
ABSL_FLAG(std::string, tls_ca, "",
          "serve: PEM CA that signed the server's certificate: connect with "
          "TLS (else MUTWO_TLS_CA)");
ABSL_FLAG(std::string, tls_cert, "",
          "serve: PEM client certificate for a server run with "
          "--tls_client_ca (mTLS); with --tls_key");
ABSL_FLAG(std::string, tls_key, "", "serve: PEM private key of --tls_cert");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve: Prometheus /metrics address (empty: off)");
ABSL_FLAG(std::string, work_dir, "",
          "serve: model cache and task files (default: "
          "$XDG_CACHE_HOME/mutwo/worker, else ~/.cache/mutwo/worker, else "
          "/tmp/mutwo-worker-UID)");
ABSL_FLAG(std::string, task_memory_limit, "auto",
          "serve: address-space limit of each CPU task process (e.g. 16GiB; "
          "auto: half the machine's memory; none: no limit)");
ABSL_FLAG(int64_t, task_time_limit_ms, 10 * 60 * 1000,
          "serve: wall-clock limit of one task process");
ABSL_FLAG(int32_t, max_tasks, 0,
          "serve: exit after this many tasks (0: never)");
ABSL_FLAG(std::string, task_file, "", "run-task: the task written by serve");
ABSL_FLAG(std::string, model_file, "", "run-task: the model file");
ABSL_FLAG(std::string, result_file, "", "run-task: where to write the result");

ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(bool, specialize_control_flow);

namespace mutwo::worker {
namespace {

// A cache, so where caches go (XDG base directories), never the current
// directory: a worker started in a checkout must not fill it.
std::string DefaultWorkDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    return absl::StrCat(xdg, "/mutwo/worker");
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/' && std::string(home) != "/") {
    return absl::StrCat(home, "/.cache/mutwo/worker");
  }
  return absl::StrCat("/tmp/mutwo-worker-", getuid());
}

// Device memory used/total without creating a CUDA context in the daemon:
// nvidia-smi for GPUs, /proc/meminfo for the host.
DeviceMemory ReadDeviceMemory(const std::string& device) {
  DeviceMemory m;
  if (device.rfind("cuda", 0) == 0) {
    std::string index = "0";
    if (auto colon = device.find(':'); colon != std::string::npos) {
      index = device.substr(colon + 1);
    }
    const std::string cmd = absl::StrCat(
        "nvidia-smi --query-gpu=memory.used,memory.total "
        "--format=csv,noheader,nounits -i ",
        index, " 2>/dev/null");
    if (FILE* pipe = popen(cmd.c_str(), "r")) {
      char buf[128] = {0};
      if (fgets(buf, sizeof(buf), pipe) != nullptr) {
        std::vector<std::string> parts = absl::StrSplit(buf, ',');
        double used = 0, total = 0;
        if (parts.size() == 2 &&
            absl::SimpleAtod(absl::StripAsciiWhitespace(parts[0]), &used) &&
            absl::SimpleAtod(absl::StripAsciiWhitespace(parts[1]), &total)) {
          m.used_bytes = static_cast<int64_t>(used * 1024 * 1024);
          m.total_bytes = static_cast<int64_t>(total * 1024 * 1024);
        }
      }
      pclose(pipe);
    }
    return m;
  }
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0, total = 0, available = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") total = kb * 1024;
    if (key == "MemAvailable:") available = kb * 1024;
  }
  m.total_bytes = total;
  m.used_bytes = total - available;
  return m;
}

// Asks a child `mutwo-worker device-info` for the device facts.
absl::StatusOr<v1::DeviceInfo> ProbeDevice(const std::string& self,
                                           const std::string& device,
                                           const std::string& work_dir) {
  const std::string out = work_dir + "/device-info.json";
  const std::string err = work_dir + "/device-info.stderr";
  ChildLimits limits;
  limits.wall_limit_ms = 120000;
  auto child = RunChild(
      {self, "device-info", "--device=" + device, "--result_file=" + out}, err,
      limits);
  if (!child.ok()) return child.status();
  if (!child->exited || child->exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("device \"", device, "\": ", child->Describe()));
  }
  v1::DeviceInfo info;
  if (absl::Status s = ReadProtoJsonFile(out, &info); !s.ok()) return s;
  return info;
}

}  // namespace

int RunDeviceInfoCommand(const ParsedArgs&) {
  auto backend = CreateDeviceBackend(absl::GetFlag(FLAGS_device), 0);
  if (!backend.ok()) return CommandFailure("device-info", backend.status());
  const std::string json = ProtoToJson((*backend)->Describe());
  const std::string path = absl::GetFlag(FLAGS_result_file);
  if (path.empty()) {
    std::cout << json;
    return kExitOk;
  }
  if (absl::Status s = WriteFileAtomically(path, json); !s.ok()) {
    return CommandFailure("device-info", s);
  }
  return kExitOk;
}

int RunTaskCommand(const ParsedArgs&) {
  const std::string cmd = "run-task";
  auto bytes = ReadFile(absl::GetFlag(FLAGS_task_file));
  if (!bytes.ok()) return CommandFailure(cmd, bytes.status());
  v1::LeaseTaskResponse lease;
  if (!lease.ParseFromString(*bytes) || !lease.has_task()) {
    return CommandFailure(
        cmd, absl::InvalidArgumentError(
                 absl::StrCat("task file \"", absl::GetFlag(FLAGS_task_file),
                              "\" does not hold a leased task")));
  }
  const v1::Task& task = lease.task();
  const v1::JobSpec& spec = lease.spec();
  std::string result;
  if (task.kind() == v1::Task::PROFILE) {
    ProfilerOptions options;
    // Errors name the model as the user uploaded it, not the cache path.
    auto model = ReadFile(absl::GetFlag(FLAGS_model_file));
    if (!model.ok()) return CommandFailure(cmd, model.status());
    options.model_bytes = *std::move(model);
    options.model_name = spec.model_name().empty()
                             ? absl::GetFlag(FLAGS_model_file)
                             : spec.model_name() + ".pt";
    options.model_sha256 = spec.model_sha256();
    options.inputs.assign(spec.inputs().begin(), spec.inputs().end());
    options.loss = spec.loss();
    options.optimizer = spec.optimizer();
    options.batch_size = task.batch_size();
    options.device = absl::GetFlag(FLAGS_device);
    options.specialize_control_flow =
        absl::GetFlag(FLAGS_specialize_control_flow);
    if (spec.warmup_iterations() > 0) {
      options.warmup_iterations = spec.warmup_iterations();
    }
    if (spec.measure_iterations() > 0) {
      options.measure_iterations = spec.measure_iterations();
    }
    auto profiler = Profiler::Create(options);
    if (!profiler.ok()) return CommandFailure(cmd, profiler.status());
    auto profile = (*profiler)->Run();
    if (!profile.ok()) return CommandFailure(cmd, profile.status());
    result = profile->SerializeAsString();
  } else {
    // VALIDATE: the schedule executed against the unmodified step;
    // MAX_BATCH: the step at a predicted max batch size only (the unmodified
    // one is what may not fit). A bad model or spec, or a schedule of
    // another graph, is InvalidArgument (exit 2).
    ExecutorOptions options;
    auto model = ReadFile(absl::GetFlag(FLAGS_model_file));
    if (!model.ok()) return CommandFailure(cmd, model.status());
    options.model_bytes = *std::move(model);
    options.model_name = spec.model_name().empty()
                             ? absl::GetFlag(FLAGS_model_file)
                             : spec.model_name() + ".pt";
    options.inputs.assign(spec.inputs().begin(), spec.inputs().end());
    options.loss = spec.loss();
    options.optimizer = spec.optimizer();
    options.batch_size = task.batch_size() > 0 ? task.batch_size()
                                               : task.schedule().batch_size();
    options.device = absl::GetFlag(FLAGS_device);
    options.specialize_control_flow =
        absl::GetFlag(FLAGS_specialize_control_flow);
    options.run_baseline = task.kind() != v1::Task::MAX_BATCH;
    if (spec.warmup_iterations() > 0) {
      options.warmup_iterations = spec.warmup_iterations();
    }
    if (spec.measure_iterations() > 0) {
      options.measure_iterations = spec.measure_iterations();
    }
    auto executor = Executor::Create(options);
    if (!executor.ok()) return CommandFailure(cmd, executor.status());
    auto validation = (*executor)->Run(task.schedule());
    if (!validation.ok()) return CommandFailure(cmd, validation.status());
    result = validation->SerializeAsString();
  }
  if (absl::Status s =
          WriteFileAtomically(absl::GetFlag(FLAGS_result_file), result);
      !s.ok()) {
    return CommandFailure(cmd, s);
  }
  return kExitOk;
}

int RunServeCommand(const ParsedArgs& args, const char* argv0) {
  const std::string cmd = "serve";
  if (!args.positional.empty()) {
    return CommandFailure(
        cmd, absl::InvalidArgumentError(absl::StrCat(
                 "unexpected argument \"", args.positional[0], "\"")));
  }
  // The daemon re-executes this binary for every task.
  char self[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string self_exe =
      n > 0 ? std::string(self, n) : std::string(argv0);
  WorkerDaemon::Options options;
  options.server = ResolveServerAddress(absl::GetFlag(FLAGS_server));
  options.credentials.token_file = absl::GetFlag(FLAGS_token_file);
  options.credentials.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.credentials.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.credentials.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.device = absl::GetFlag(FLAGS_device);
  options.specialize_control_flow =
      absl::GetFlag(FLAGS_specialize_control_flow);
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  const bool default_work_dir = options.work_dir.empty();
  if (default_work_dir) options.work_dir = DefaultWorkDir();
  options.self_executable = self_exe;
  options.task_time_limit_ms = absl::GetFlag(FLAGS_task_time_limit_ms);
  options.max_tasks = absl::GetFlag(FLAGS_max_tasks);
  const std::string memory_limit = absl::GetFlag(FLAGS_task_memory_limit);
  if (memory_limit == "none" || memory_limit == "0") {
    options.task_memory_limit_bytes = 0;
  } else if (memory_limit != "auto" && !memory_limit.empty()) {
    auto limit = ParseMemorySize("--task_memory_limit", memory_limit);
    if (!limit.ok()) return CommandFailure(cmd, limit.status());
    options.task_memory_limit_bytes = *limit;
  }
  const std::string device = options.device;
  if (device != "cpu" && device.rfind("cuda", 0) != 0) {
    return CommandFailure(
        cmd, absl::InvalidArgumentError(absl::StrCat(
                 "--device \"", device, "\": use cpu, cuda or cuda:N")));
  }
  if (default_work_dir) {
    // Its parents (~/.cache) may not exist yet; the daemon makes the last
    // level.
    std::error_code ec;
    std::filesystem::create_directories(options.work_dir, ec);
    if (ec) {
      return CommandFailure(
          cmd, absl::PermissionDeniedError(absl::StrCat(
                   "cannot create the work directory \"", options.work_dir,
                   "\": ", ec.message(), "; give --work_dir")));
    }
  }
  const std::string work_dir = options.work_dir;
  options.probe_device = [self_exe, device, work_dir] {
    return ProbeDevice(self_exe, device, work_dir);
  };
  options.device_memory = [device] { return ReadDeviceMemory(device); };

  // Signals are handled on a dedicated thread with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // our own wake-up when Run ends by itself
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto daemon = WorkerDaemon::Create(options);
  if (!daemon.ok()) return CommandFailure(cmd, daemon.status());
  std::unique_ptr<MetricsEndpoint> metrics;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    auto endpoint = StartMetricsEndpoint(absl::GetFlag(FLAGS_metrics_listen),
                                         (*daemon)->registry());
    if (!endpoint.ok()) return CommandFailure(cmd, endpoint.status());
    metrics = *std::move(endpoint);
    MUTWO_LOG(info, "metrics on port {}", metrics->port());
  }
  WorkerDaemon* d = daemon->get();
  std::thread signal_thread([d, &signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGUSR1) return;
    MUTWO_LOG(info, "signal {}: stopping", sig);
    d->Shutdown();
  });
  absl::Status status = d->Run();
  // Wake the signal thread if Run ended on its own (max_tasks).
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  if (!status.ok()) return CommandFailure(cmd, status);
  MUTWO_LOG(info, "stopped");
  return kExitOk;
}

}  // namespace mutwo::worker
