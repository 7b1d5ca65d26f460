#include "worker/daemon/daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/proto_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "worker/daemon/child_process.h"

namespace mutwo {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

absl::Status MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create \"", path, "\": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

prometheus::Histogram::BucketBoundaries TaskSecondsBuckets() {
  return {1, 5, 15, 30, 60, 120, 300, 600, 1800};
}

}  // namespace

WorkerDaemon::WorkerDaemon(Options options)
    : options_(std::move(options)),
      registry_(std::make_shared<prometheus::Registry>()),
      tasks_total_(BuildCounter()
                       .Name("mutwo_worker_tasks_total")
                       .Help("Tasks run by this worker, by kind and result")
                       .Register(*registry_)),
      task_seconds_(BuildHistogram()
                        .Name("mutwo_worker_task_duration_seconds")
                        .Help("Wall time of one task process, by kind")
                        .Register(*registry_)),
      memory_used_(BuildGauge()
                       .Name("mutwo_worker_device_memory_used_bytes")
                       .Help("Device memory in use (GPU: whole device)")
                       .Register(*registry_)
                       .Add({})),
      memory_total_(BuildGauge()
                        .Name("mutwo_worker_device_memory_total_bytes")
                        .Help("Device memory capacity")
                        .Register(*registry_)
                        .Add({})),
      busy_(BuildGauge()
                .Name("mutwo_worker_busy")
                .Help("1 while a task process runs")
                .Register(*registry_)
                .Add({})) {
  // Every (kind, result) at zero from the start: the task-failure alert
  // compares a worker's failures with its successes, which must exist (at
  // 0) before the first success.
  for (const v1::Task::Kind kind :
       {v1::Task::PROFILE, v1::Task::VALIDATE, v1::Task::MAX_BATCH}) {
    const std::string name = v1::Task::Kind_Name(kind);
    for (const char* result :
         {"succeeded", "failed", "abandoned", "rejected", "unreported"}) {
      tasks_total_.Add({{"kind", name}, {"result", result}});
    }
    task_seconds_.Add({{"kind", name}}, TaskSecondsBuckets());
  }
}

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(
    Options options) {
  if (options.server.empty()) {
    return absl::InvalidArgumentError("--server must not be empty");
  }
  if (options.self_executable.empty()) {
    return absl::InvalidArgumentError("worker executable path unknown");
  }
  if (options.work_dir.empty()) {
    return absl::InvalidArgumentError("--work_dir must not be empty");
  }
  if (!options.probe_device) {
    return absl::InvalidArgumentError("no device probe");
  }
  ClientCredentialsOptions credential_options = options.credentials;
  credential_options.target = options.server;
  MUTWO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         MakeChannelCredentials(credential_options));
  MUTWO_RETURN_IF_ERROR(MakeDir(options.work_dir));
  MUTWO_RETURN_IF_ERROR(MakeDir(options.work_dir + "/models"));
  MUTWO_RETURN_IF_ERROR(MakeDir(options.work_dir + "/tasks"));
  auto daemon =
      std::unique_ptr<WorkerDaemon>(new WorkerDaemon(std::move(options)));
  MUTWO_ASSIGN_OR_RETURN(*daemon->info_.mutable_device(),
                         daemon->options_.probe_device());
  daemon->info_.set_hostname(Hostname());
  daemon->info_.set_version(kVersion);
  daemon->info_.set_state(v1::WorkerInfo::IDLE);
  daemon->channel_ =
      grpc::CreateChannel(daemon->options_.server, std::move(credentials));
  daemon->stub_ = v1::WorkerHub::NewStub(daemon->channel_);
  daemon->RefreshDeviceGauges();
  return daemon;
}

std::chrono::system_clock::time_point WorkerDaemon::Deadline(int64_t ms) const {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

void WorkerDaemon::RefreshDeviceGauges() {
  if (!options_.device_memory) {
    memory_total_.Set(static_cast<double>(info_.device().total_bytes()));
    return;
  }
  const DeviceMemory m = options_.device_memory();
  memory_used_.Set(static_cast<double>(m.used_bytes));
  memory_total_.Set(static_cast<double>(m.total_bytes));
}

void WorkerDaemon::Backoff(int attempt) {
  // Exponential backoff with full jitter, capped.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const int64_t cap = std::min<int64_t>(options_.max_backoff_ms,
                                        int64_t{200} << std::min(attempt, 10));
  std::uniform_int_distribution<int64_t> dist(cap / 2, cap);
  Sleep(dist(rng));
}

void WorkerDaemon::Pause(int64_t hint_ms) {
  // Up to a fifth later than asked, so refused workers do not come back
  // together.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int64_t> dist(hint_ms, hint_ms + hint_ms / 5);
  Sleep(dist(rng));
}

void WorkerDaemon::Sleep(int64_t wait_ms) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (!stopping_ && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

absl::Status WorkerDaemon::Register() {
  v1::RegisterWorkerRequest request;
  *request.mutable_worker() = info_;
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  context.set_deadline(Deadline(options_.rpc_timeout_ms));
  SetActiveCall(&context);
  const grpc::Status status =
      stub_->RegisterWorker(&context, request, &response);
  SetActiveCall(nullptr);
  MUTWO_RETURN_IF_ERROR(FromGrpcStatus(status));
  info_.set_worker_id(response.worker_id());
  if (response.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ms_ = response.heartbeat_interval_ms();
  }
  MUTWO_LOG(info, "registered as {} with {} ({})", info_.worker_id(),
            options_.server, info_.device().name());
  return absl::OkStatus();
}

absl::StatusOr<std::string> WorkerDaemon::EnsureModel(
    const std::string& sha256) {
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("task names a bad model sha256 \"", sha256, "\""));
  }
  const std::string path =
      absl::StrCat(options_.work_dir, "/models/", sha256, ".pt");
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return path;
  v1::FetchModelRequest request;
  request.set_sha256(sha256);
  grpc::ClientContext context;
  context.set_deadline(Deadline(options_.rpc_timeout_ms * 4));
  auto reader = stub_->FetchModel(&context, request);
  v1::FetchModelChunk chunk;
  std::string bytes;
  Sha256 sha;
  while (reader->Read(&chunk)) {
    sha.Update(chunk.data());
    bytes += chunk.data();
  }
  MUTWO_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  const std::string got = sha.HexDigest();
  if (got != sha256) {
    return absl::DataLossError(
        absl::StrCat("model ", sha256, ": fetched bytes hash to ", got));
  }
  MUTWO_RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  return path;
}

absl::Status WorkerDaemon::RunOneTask(const v1::LeaseTaskResponse& lease) {
  const v1::Task& task = lease.task();
  const std::string kind = v1::Task::Kind_Name(task.kind());
  MUTWO_LOG(info, "task {} ({} batch {}, attempt {})", task.task_id(), kind,
            task.batch_size(), task.attempt());
  auto fail = [&](const std::string& reason, bool retryable) {
    v1::FailTaskRequest request;
    request.set_worker_id(info_.worker_id());
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    request.set_reason(reason);
    request.set_retryable(retryable);
    v1::ReportResponse response;
    grpc::ClientContext context;
    context.set_deadline(Deadline(options_.rpc_timeout_ms));
    const grpc::Status s = stub_->FailTask(&context, request, &response);
    MUTWO_LOG(warn, "task {} failed ({}): {}{}", task.task_id(),
              retryable ? "retryable" : "final", reason,
              s.ok() ? "" : absl::StrCat(" [report: ", s.error_message(), "]"));
    tasks_total_.Add({{"kind", kind}, {"result", "failed"}}).Increment();
  };

  auto model_path = EnsureModel(lease.spec().model_sha256());
  if (!model_path.ok()) {
    fail(std::string(model_path.status().message()), true);
    return absl::OkStatus();
  }
  const std::string base =
      absl::StrCat(options_.work_dir, "/tasks/", task.task_id());
  const std::string task_file = base + ".task.pb";
  const std::string result_file = base + ".result.pb";
  const std::string stderr_file = base + ".stderr";
  std::remove(result_file.c_str());
  MUTWO_RETURN_IF_ERROR(
      WriteFileAtomically(task_file, lease.SerializeAsString()));

  ChildLimits limits;
  limits.wall_limit_ms = options_.task_time_limit_ms;
  if (options_.device.rfind("cuda", 0) != 0) {
    limits.memory_limit_bytes = options_.task_memory_limit_bytes;
  }
  limits.tick_interval_ms = heartbeat_interval_ms_;
  bool lease_lost = false;
  limits.on_tick = [&] {
    if (stopping_) return false;
    RefreshDeviceGauges();
    v1::HeartbeatRequest request;
    request.set_worker_id(info_.worker_id());
    request.set_task_id(task.task_id());
    request.set_fence_token(task.fence_token());
    *request.mutable_worker() = info_;
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    context.set_deadline(Deadline(options_.rpc_timeout_ms));
    const grpc::Status s = stub_->Heartbeat(&context, request, &response);
    if (!s.ok()) return true;  // server away: keep going, the fence decides
    if (!response.lease_valid() || response.cancelled()) {
      lease_lost = true;
      return false;
    }
    return true;
  };
  busy_.Set(1);
  auto child =
      RunChild({options_.self_executable, "run-task",
                "--task_file=" + task_file, "--model_file=" + *model_path,
                "--result_file=" + result_file, "--device=" + options_.device,
                std::string("--specialize_control_flow=") +
                    (options_.specialize_control_flow ? "true" : "false")},
               stderr_file, limits);
  busy_.Set(0);
  RefreshDeviceGauges();
  std::remove(task_file.c_str());
  if (!child.ok()) {
    fail(std::string(child.status().message()), true);
    return absl::OkStatus();
  }
  task_seconds_.Add({{"kind", kind}}, TaskSecondsBuckets())
      .Observe(child->wall_ms / 1000.0);
  if (lease_lost) {
    MUTWO_LOG(warn, "task {}: lease lost or job cancelled; child stopped",
              task.task_id());
    tasks_total_.Add({{"kind", kind}, {"result", "abandoned"}}).Increment();
    return absl::OkStatus();
  }
  if (stopping_ && child->stopped) {
    fail("worker shutting down", true);
    return absl::OkStatus();
  }
  if (!child->exited || child->exit_code != 0) {
    // Exit code 2: the model or the spec is bad; retrying cannot help.
    fail(child->Describe(), !(child->exited && child->exit_code == 2));
    return absl::OkStatus();
  }
  auto result = ReadFile(result_file);
  std::remove(result_file.c_str());
  std::remove(stderr_file.c_str());
  if (!result.ok()) {
    fail(absl::StrCat("task process wrote no result: ",
                      result.status().message()),
         true);
    return absl::OkStatus();
  }
  for (int attempt = 0; !stopping_ || attempt == 0; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(options_.rpc_timeout_ms));
    v1::ReportResponse response;
    grpc::Status s;
    if (task.kind() == v1::Task::PROFILE) {
      v1::ReportProfileRequest request;
      request.set_worker_id(info_.worker_id());
      request.set_task_id(task.task_id());
      request.set_fence_token(task.fence_token());
      if (!request.mutable_profile()->ParseFromString(*result)) {
        fail("task process wrote an unreadable profile", true);
        return absl::OkStatus();
      }
      s = stub_->ReportProfile(&context, request, &response);
    } else {
      v1::ReportValidationRequest request;
      request.set_worker_id(info_.worker_id());
      request.set_task_id(task.task_id());
      request.set_fence_token(task.fence_token());
      if (!request.mutable_validation()->ParseFromString(*result)) {
        fail("task process wrote an unreadable validation", true);
        return absl::OkStatus();
      }
      s = stub_->ReportValidation(&context, request, &response);
    }
    if (s.ok()) {
      tasks_total_.Add({{"kind", kind}, {"result", "succeeded"}}).Increment();
      MUTWO_LOG(info, "task {} reported ({:.0f} ms)", task.task_id(),
                child->wall_ms);
      return absl::OkStatus();
    }
    // A server whose planning is busy says when to report again.
    if (std::optional<int64_t> hint = RetryPushbackMs(context);
        s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        hint.has_value() && attempt < 8) {
      MUTWO_LOG(info, "task {}: {}; reporting again in {} ms", task.task_id(),
                s.error_message(), *hint);
      Pause(*hint);
      continue;
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      MUTWO_LOG(warn, "task {}: report rejected: {}", task.task_id(),
                s.error_message());
      tasks_total_.Add({{"kind", kind}, {"result", "rejected"}}).Increment();
      return absl::OkStatus();
    }
    if (attempt >= 8) break;
    Backoff(attempt);
  }
  tasks_total_.Add({{"kind", kind}, {"result", "unreported"}}).Increment();
  return absl::OkStatus();
}

absl::Status WorkerDaemon::Run() {
  int failures = 0;
  int done = 0;
  while (!stopping_) {
    if (info_.worker_id().empty()) {
      if (absl::Status s = Register(); !s.ok()) {
        MUTWO_LOG(warn, "register with {}: {}", options_.server, s.ToString());
        Backoff(failures++);
        continue;
      }
      failures = 0;
    }
    v1::LeaseTaskRequest request;
    request.set_worker_id(info_.worker_id());
    request.set_wait_ms(options_.lease_wait_ms);
    v1::LeaseTaskResponse response;
    grpc::ClientContext context;
    context.set_deadline(
        Deadline(options_.lease_wait_ms + options_.rpc_timeout_ms));
    SetActiveCall(&context);
    const grpc::Status s = stub_->LeaseTask(&context, request, &response);
    SetActiveCall(nullptr);
    if (stopping_) {
      // A task leased while we were told to stop goes straight back.
      if (s.ok() && response.has_task()) {
        v1::FailTaskRequest release;
        release.set_worker_id(info_.worker_id());
        release.set_task_id(response.task().task_id());
        release.set_fence_token(response.task().fence_token());
        release.set_reason("worker shutting down");
        release.set_retryable(true);
        v1::ReportResponse ignored;
        grpc::ClientContext release_context;
        release_context.set_deadline(Deadline(options_.rpc_timeout_ms));
        (void)stub_->FailTask(&release_context, release, &ignored);
      }
      break;
    }
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        info_.clear_worker_id();  // the server forgot us: register again
      }
      MUTWO_LOG(warn, "lease: {}", s.error_message());
      // An overloaded server says when to come back (too many open
      // polls): wait that long, with jitter, instead of the backoff.
      if (std::optional<int64_t> hint = RetryPushbackMs(context);
          s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
          hint.has_value()) {
        Pause(*hint);
        continue;
      }
      Backoff(failures++);
      continue;
    }
    failures = 0;
    if (!response.has_task()) continue;
    MUTWO_RETURN_IF_ERROR(RunOneTask(response));
    if (options_.max_tasks > 0 && ++done >= options_.max_tasks) break;
  }
  Deregister();
  stopped_.Notify();
  return absl::OkStatus();
}

void WorkerDaemon::Deregister() {
  if (info_.worker_id().empty()) return;
  // Best effort: a server that does not hear it marks the worker LOST
  // after missed heartbeats instead.
  v1::HeartbeatRequest request;
  request.set_worker_id(info_.worker_id());
  request.set_stopping(true);
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      Deadline(std::min<int64_t>(options_.rpc_timeout_ms, 2000)));
  const grpc::Status s = stub_->Heartbeat(&context, request, &response);
  if (s.ok()) {
    MUTWO_LOG(info, "worker {} deregistered", info_.worker_id());
  } else {
    MUTWO_LOG(warn, "deregister: {}", s.error_message());
  }
}

void WorkerDaemon::SetActiveCall(grpc::ClientContext* context) {
  absl::MutexLock lock(&call_mu_);
  active_call_ = context;
  if (context != nullptr && stopping_) context->TryCancel();
}

void WorkerDaemon::Shutdown() {
  stopping_ = true;
  absl::MutexLock lock(&call_mu_);
  if (active_call_ != nullptr) active_call_->TryCancel();
}

}  // namespace mutwo
