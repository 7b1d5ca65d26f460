#include "server/services.h"

#include <chrono>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/job_progress.h"
#include "server/job_watch.h"
#include "server/leasing.h"

namespace mutwo {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    default:
      return "OTHER";
  }
}

// Times one RPC and records it under its method and final code.
class RpcTimer {
 public:
  RpcTimer(ServerMetrics* metrics, const char* method)
      : metrics_(metrics),
        method_(method),
        start_(std::chrono::steady_clock::now()) {}
  grpc::Status Done(const absl::Status& status) {
    grpc::Status g = ToGrpcStatus(status);
    metrics_->ObserveRpc(
        method_, CodeName(g.error_code()),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count());
    return g;
  }

 private:
  ServerMetrics* metrics_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
};

template <typename T>
absl::Status Assign(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return result.status();
  *out = *std::move(result);
  return absl::OkStatus();
}

absl::Status RequireId(const std::string& value, const char* field) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be set"));
  }
  return absl::OkStatus();
}

// Adds the retry hint of a refused long wait (WaiterSet::RetryAfterMs) to
// the trailers: gRPC clients with retries read grpc-retry-pushback-ms, ours
// read it too (worker daemon, CLI).
void AddRetryHint(grpc::ServerContextBase* context, const absl::Status& s) {
  if (std::optional<int64_t> ms = WaiterSet::RetryAfterMs(s); ms.has_value()) {
    context->AddTrailingMetadata("grpc-retry-pushback-ms", absl::StrCat(*ms));
  }
}

// ReportProfile off gRPC's threads: authorize, hand the planning to the
// PlanningPool and return; the pool's thread answers when the report is
// stored, refused, or stopped (the worker's call ended, the server drains).
// A full pool answers RESOURCE_EXHAUSTED at once (not counted against the
// worker by the quarantine: the server is busy, the worker did no wrong).
class ReportProfileReactor final : public grpc::ServerUnaryReactor {
 public:
  ReportProfileReactor(grpc::CallbackServerContext* context,
                       const v1::ReportProfileRequest* request,
                       v1::ReportResponse* response, JobCore* core,
                       const auth::Authorizer* auth, ServerMetrics* metrics,
                       WorkerQuarantine* quarantine, PlanningPool* pool)
      : timer_(metrics, "ReportProfile") {
    auto caller =
        auth->ForWorker(*context, "ReportProfile", request->worker_id());
    if (!caller.ok()) {
      Finish(timer_.Done(caller.status()));
      return;
    }
    absl::Status queued =
        pool->Submit([this, context, request, response, core,
                      quarantine](const std::function<bool()>& stop) {
          absl::Status s = core->ReportProfile(
              *request, [&] { return stop() || context->IsCancelled(); });
          if (absl::IsCancelled(s) && stop()) {
            s = absl::UnavailableError(
                absl::StrCat("the server is shutting down: ", s.message(),
                             "; report again to the next server"));
          }
          quarantine->ReportAnswered(request->worker_id(), s);
          response->set_accepted(s.ok());
          Finish(timer_.Done(s));
        });
    if (!queued.ok()) {
      // The worker keeps the profile and reports again after the hint (the
      // daemon reads it, as for lease polls).
      AddRetryHint(context, queued);
      Finish(timer_.Done(queued));
    }
  }
  void OnDone() override { delete this; }

 private:
  RpcTimer timer_;
};

// LeaseTask without a thread: authorize, register a LeasePoll, answer from
// whichever thread ends the poll. gRPC calls OnCancel and OnDone only after
// this constructor (the handler) returned.
class LeaseReactor final : public grpc::ServerUnaryReactor {
 public:
  LeaseReactor(grpc::CallbackServerContext* context,
               const v1::LeaseTaskRequest& request,
               v1::LeaseTaskResponse* response, JobCore* core,
               const auth::Authorizer* auth, ServerMetrics* metrics,
               PrincipalLimits* limits)
      : context_(context),
        response_(response),
        core_(core),
        timer_(metrics, "LeaseTask"),
        poll_(
            &core->leasing(), request,
            [context] { return context->IsCancelled(); },
            [this](absl::StatusOr<v1::LeaseTaskResponse> r) {
              Answer(std::move(r));
            }) {
    if (auto s = RequireId(request.worker_id(), "worker_id"); !s.ok()) {
      Answer(s);
      return;
    }
    auto caller = auth->ForWorker(*context, "LeaseTask", request.worker_id());
    if (!caller.ok()) {
      Answer(caller.status());
      return;
    }
    absl::StatusOr<PrincipalLimits::Slot> slot = limits->Acquire(caller->name);
    if (!slot.ok()) {
      Answer(slot.status());
      return;
    }
    slot_ = *std::move(slot);
    // The long poll ends when the worker goes away, and a task leased for
    // a poll nobody waits on any more is given back at once.
    absl::StatusOr<uint64_t> id = core_->leasing().StartPoll(&poll_);
    if (!id.ok()) {
      Answer(id.status());
      return;
    }
    id_ = *id;
  }

  void OnCancel() override {
    if (id_ != 0) core_->leasing().CancelPoll(id_);
  }
  void OnDone() override { delete this; }

 private:
  // Called once: by the constructor (nothing registered) or by the poll.
  void Answer(absl::StatusOr<v1::LeaseTaskResponse> result) {
    if (result.ok()) {
      *response_ = *std::move(result);
    } else {
      AddRetryHint(context_, result.status());
    }
    Finish(timer_.Done(result.status()));
  }

  grpc::CallbackServerContext* context_;
  v1::LeaseTaskResponse* response_;
  JobCore* core_;
  RpcTimer timer_;
  LeasePoll poll_;
  uint64_t id_ = 0;
  PrincipalLimits::Slot slot_;  // given back when the call ends
};

// WatchJob without a thread: authorize, register a JobWatch that writes
// through this reactor, one write at a time.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(grpc::CallbackServerContext* context,
               const v1::WatchJobRequest& request, JobCore* core,
               const auth::Authorizer* auth, ServerMetrics* metrics,
               PrincipalLimits* limits)
      : context_(context),
        timer_(metrics, "WatchJob"),
        watch_(core, request.job_id(),
               JobWatch::Sink{[this](const v1::JobEvent& e) {
                                event_ = e;
                                StartWrite(&event_);
                              },
                              [this](const v1::JobEvent& e) {
                                event_ = e;
                                StartWriteAndFinish(
                                    &event_, grpc::WriteOptions(),
                                    timer_.Done(absl::OkStatus()));
                              },
                              [this](const absl::Status& s) { End(s); }}) {
    if (auto s = RequireId(request.job_id(), "job_id"); !s.ok()) {
      End(s);
      return;
    }
    auto caller = auth->ForJob(*context, "WatchJob", request.job_id());
    if (!caller.ok()) {
      End(caller.status());
      return;
    }
    absl::StatusOr<PrincipalLimits::Slot> slot = limits->Acquire(caller->name);
    if (!slot.ok()) {
      End(slot.status());
      return;
    }
    slot_ = *std::move(slot);
    if (absl::Status s = watch_.Start(); !s.ok()) End(s);
  }

  void OnWriteDone(bool ok) override { watch_.WriteDone(ok); }
  void OnCancel() override { watch_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& s) {
    AddRetryHint(context_, s);
    Finish(timer_.Done(s));
  }

  grpc::CallbackServerContext* context_;
  RpcTimer timer_;
  JobWatch watch_;
  v1::JobEvent event_;          // the write in flight
  PrincipalLimits::Slot slot_;  // given back when the stream ends
};

}  // namespace

grpc::Status PlannerService::UploadModel(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::UploadModelRequest>* reader,
    v1::UploadModelResponse* response) {
  RpcTimer timer(metrics_, "UploadModel");
  auto caller = auth_->ForUpload(*context);
  if (!caller.ok()) return timer.Done(caller.status());
  // Streamed to a temp file chunk by chunk (never whole in memory), within
  // the caller's concurrency and byte quotas (running uploads, stored
  // models); dropped when it stops sending.
  auto upload = core_->NewUpload(caller->name);
  if (!upload.ok()) return timer.Done(upload.status());
  std::unique_ptr<UploadWatchdog::Guard> idle =
      limits_.idle_uploads->Watch(context);
  UploadQuota::Reservation reserved;  // the declared bytes, until the end
  auto header = [&](const v1::UploadModelHeader& h) -> absl::Status {
    absl::StatusOr<UploadQuota::Reservation> r =
        limits_.stored_models->Admit(*caller, h);
    if (!r.ok()) return r.status();
    reserved = *std::move(r);
    return (*upload)->Header(h);
  };
  v1::UploadModelRequest message;
  while (reader->Read(&message)) {
    idle->Touch();
    absl::Status s = message.has_header() ? header(message.header())
                                          : (*upload)->Chunk(message.chunk());
    // Stop reading at the first error: nothing has been stored.
    if (!s.ok()) return timer.Done(s);
  }
  if (idle->dropped()) {
    return timer.Done(absl::DeadlineExceededError(absl::StrCat(
        "upload: nothing received for ",
        limits_.idle_uploads->idle_timeout_ms(),
        " ms (--upload_idle_timeout_ms); dropped, nothing stored")));
  }
  if (absl::Status s = (*upload)->Finish(); !s.ok()) return timer.Done(s);
  return timer.Done(
      Assign(core_->StoreUpload(**upload, caller->name), response));
}

grpc::Status PlannerService::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  RpcTimer timer(metrics_, "SubmitJob");
  auto caller = auth_->ForSubmit(*context, request->spec().model_sha256());
  if (!caller.ok()) return timer.Done(caller.status());
  return timer.Done(Assign(core_->SubmitJob(*request, caller->name), response));
}

grpc::Status PlannerService::GetJob(grpc::ServerContext* context,
                                    const v1::GetJobRequest* request,
                                    v1::Job* response) {
  RpcTimer timer(metrics_, "GetJob");
  if (auto s = RequireId(request->job_id(), "job_id"); !s.ok())
    return timer.Done(s);
  if (auto caller = auth_->ForJob(*context, "GetJob", request->job_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  return timer.Done(Assign(core_->GetJob(request->job_id()), response));
}

grpc::Status PlannerService::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  RpcTimer timer(metrics_, "ListJobs");
  auto owner = auth_->ForListJobs(*context);
  if (!owner.ok()) return timer.Done(owner.status());
  return timer.Done(Assign(core_->ListJobs(*request, *owner), response));
}

grpc::ServerWriteReactor<v1::JobEvent>* PlannerService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return new WatchReactor(context, *request, core_, auth_, metrics_,
                          limits_.watches);
}

grpc::Status PlannerService::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request,
                                       v1::Job* response) {
  RpcTimer timer(metrics_, "CancelJob");
  if (auto s = RequireId(request->job_id(), "job_id"); !s.ok())
    return timer.Done(s);
  if (auto caller = auth_->ForJob(*context, "CancelJob", request->job_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  return timer.Done(Assign(core_->CancelJob(request->job_id()), response));
}

grpc::Status PlannerService::GetProfile(grpc::ServerContext* context,
                                        const v1::GetProfileRequest* request,
                                        v1::Profile* response) {
  RpcTimer timer(metrics_, "GetProfile");
  if (auto s = RequireId(request->job_id(), "job_id"); !s.ok())
    return timer.Done(s);
  if (auto caller = auth_->ForJob(*context, "GetProfile", request->job_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  return timer.Done(Assign(core_->GetProfile(*request), response));
}

grpc::Status PlannerService::GetSchedule(grpc::ServerContext* context,
                                         const v1::GetScheduleRequest* request,
                                         v1::Schedule* response) {
  RpcTimer timer(metrics_, "GetSchedule");
  if (auto s = RequireId(request->job_id(), "job_id"); !s.ok())
    return timer.Done(s);
  if (auto caller = auth_->ForJob(*context, "GetSchedule", request->job_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  // Planning stops when the caller leaves (or its deadline passes, which
  // cancels the call): an abandoned request uses no more CPU.
  return timer.Done(
      Assign(core_->GetSchedule(*request,
                                [context] { return context->IsCancelled(); }),
             response));
}

grpc::Status PlannerService::ReportTrainingLoop(
    grpc::ServerContext* context, const v1::ReportTrainingLoopRequest* request,
    v1::ReportTrainingLoopResponse* response) {
  RpcTimer timer(metrics_, "ReportTrainingLoop");
  if (auto s = RequireId(request->job_id(), "job_id"); !s.ok())
    return timer.Done(s);
  auto caller =
      auth_->ForJob(*context, "ReportTrainingLoop", request->job_id());
  if (!caller.ok()) return timer.Done(caller.status());
  return timer.Done(
      Assign(core_->ReportTrainingLoop(*request, caller->name), response));
}

grpc::Status PlannerService::ListWorkers(grpc::ServerContext* context,
                                         const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* response) {
  RpcTimer timer(metrics_, "ListWorkers");
  if (auto caller = auth_->ForListWorkers(*context); !caller.ok()) {
    return timer.Done(caller.status());
  }
  return timer.Done(Assign(core_->ListWorkers(), response));
}

grpc::Status WorkerHubService::RegisterWorker(
    grpc::ServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  RpcTimer timer(metrics_, "RegisterWorker");
  auto caller = auth_->ForRegister(*context);
  if (!caller.ok()) return timer.Done(caller.status());
  return timer.Done(
      Assign(core_->RegisterWorker(*request, caller->name), response));
}

grpc::ServerUnaryReactor* WorkerHubService::LeaseTask(
    grpc::CallbackServerContext* context, const v1::LeaseTaskRequest* request,
    v1::LeaseTaskResponse* response) {
  return new LeaseReactor(context, *request, response, core_, auth_, metrics_,
                          lease_polls_);
}

grpc::Status WorkerHubService::FetchModel(
    grpc::ServerContext* context, const v1::FetchModelRequest* request,
    grpc::ServerWriter<v1::FetchModelChunk>* writer) {
  RpcTimer timer(metrics_, "FetchModel");
  if (auto caller = auth_->ForFetchModel(*context, request->sha256());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  auto path = core_->ModelPath(request->sha256());
  if (!path.ok()) return timer.Done(path.status());
  std::ifstream in(*path, std::ios::binary | std::ios::ate);
  if (!in) {
    return timer.Done(absl::DataLossError(
        absl::StrCat("model ", request->sha256(), ": file unreadable")));
  }
  const int64_t total = in.tellg();
  in.seekg(0);
  std::string buf(static_cast<size_t>(JobCore::kMaxChunkBytes), '\0');
  bool first = true;
  while (!context->IsCancelled() && in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    v1::FetchModelChunk chunk;
    chunk.set_data(buf.data(), static_cast<size_t>(n));
    if (first) chunk.set_total_bytes(total);
    first = false;
    if (!writer->Write(chunk)) break;
  }
  return timer.Done(absl::OkStatus());
}

grpc::Status WorkerHubService::Heartbeat(grpc::ServerContext* context,
                                         const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* response) {
  RpcTimer timer(metrics_, "Heartbeat");
  if (auto caller =
          auth_->ForWorker(*context, "Heartbeat", request->worker_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  return timer.Done(Assign(core_->Heartbeat(*request), response));
}

grpc::ServerUnaryReactor* WorkerHubService::ReportProfile(
    grpc::CallbackServerContext* context,
    const v1::ReportProfileRequest* request, v1::ReportResponse* response) {
  return new ReportProfileReactor(context, request, response, core_, auth_,
                                  metrics_, quarantine_, planning_);
}

grpc::Status WorkerHubService::ReportValidation(
    grpc::ServerContext* context, const v1::ReportValidationRequest* request,
    v1::ReportResponse* response) {
  RpcTimer timer(metrics_, "ReportValidation");
  if (auto caller =
          auth_->ForWorker(*context, "ReportValidation", request->worker_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  absl::Status s = core_->ReportValidation(*request);
  quarantine_->ReportAnswered(request->worker_id(), s);
  response->set_accepted(s.ok());
  return timer.Done(s);
}

grpc::Status WorkerHubService::FailTask(grpc::ServerContext* context,
                                        const v1::FailTaskRequest* request,
                                        v1::ReportResponse* response) {
  RpcTimer timer(metrics_, "FailTask");
  if (auto caller =
          auth_->ForWorker(*context, "FailTask", request->worker_id());
      !caller.ok()) {
    return timer.Done(caller.status());
  }
  absl::Status s = core_->FailTask(*request);
  if (s.ok()) quarantine_->TaskFailed(request->worker_id(), request->reason());
  quarantine_->ReportAnswered(request->worker_id(), s);
  response->set_accepted(s.ok());
  return timer.Done(s);
}

}  // namespace mutwo
