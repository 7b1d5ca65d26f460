// The gRPC services of mutwo-server. Handlers are thin: authorize the caller
// (one Authorizer call, server/auth/authorizer.h), validate the request
// shape, call JobCore, record RPC latency, and map absl::Status to
// grpc::Status once (common/grpc_status.h).
//
// The long waits, LeaseTask and WatchJob, use the callback API: their
// reactors hold no thread while they wait (Leasing's LeasePoll and JobWatch
// are woken by changes, deadlines, cancellation and shutdown), so hundreds
// of open polls and watches leave the sync threads to the other RPCs. Past
// --max_lease_waiters / --max_watchers they answer RESOURCE_EXHAUSTED with a
// retry hint (the message, and grpc-retry-pushback-ms in the trailers).
// Authorization is the same Authorizer call as every other RPC, made before
// anything waits; then the caller's place among its principal's waits
// (principal_limits.h: --max_watchers_per_client,
// --max_lease_waiters_per_worker), held until the call ends.
#ifndef MUTWO_SERVER_SERVICES_H_
#define MUTWO_SERVER_SERVICES_H_

#include <string>

#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "server/auth/authorizer.h"
#include "server/job_core.h"
#include "server/metrics.h"
#include "server/planning_pool.h"
#include "server/principal_limits.h"
#include "server/upload_quota.h"
#include "server/upload_watchdog.h"
#include "server/worker_quarantine.h"
#include "storage/store.h"

namespace mutwo {

class PlannerService final
    : public v1::Planner::WithCallbackMethod_WatchJob<v1::Planner::Service> {
 public:
  // What one principal may hold (not owned; they outlive the service).
  struct Limits {
    PrincipalLimits* watches;      // open watches
    UploadQuota* stored_models;    // bytes of models kept
    UploadWatchdog* idle_uploads;  // uploads that stopped sending
  };
  PlannerService(JobCore* core, const auth::Authorizer* auth,
                 ServerMetrics* metrics, int64_t max_model_bytes, Limits limits)
      : core_(core),
        auth_(auth),
        metrics_(metrics),
        max_model_bytes_(max_model_bytes),
        limits_(limits) {}

  grpc::Status UploadModel(grpc::ServerContext* context,
                           grpc::ServerReader<v1::UploadModelRequest>* reader,
                           v1::UploadModelResponse* response) override;
  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context,
      const v1::WatchJobRequest* request) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetProfile(grpc::ServerContext* context,
                          const v1::GetProfileRequest* request,
                          v1::Profile* response) override;
  grpc::Status GetSchedule(grpc::ServerContext* context,
                           const v1::GetScheduleRequest* request,
                           v1::Schedule* response) override;
  grpc::Status ReportTrainingLoop(
      grpc::ServerContext* context,
      const v1::ReportTrainingLoopRequest* request,
      v1::ReportTrainingLoopResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  JobCore* core_;
  const auth::Authorizer* auth_;
  ServerMetrics* metrics_;
  int64_t max_model_bytes_;
  Limits limits_;
};

class WorkerHubService final
    : public v1::WorkerHub::WithCallbackMethod_LeaseTask<
          v1::WorkerHub::WithCallbackMethod_ReportProfile<
              v1::WorkerHub::Service>> {
 public:
  // `lease_polls` (not owned) limits the open polls of each principal;
  // `quarantine` (not owned) counts each worker's failures and refuses
  // leases to the quarantined.
  // `planning` (not owned) runs ReportProfile's planning off gRPC's
  // threads (planning_pool.h).
  WorkerHubService(JobCore* core, const auth::Authorizer* auth,
                   ServerMetrics* metrics, PrincipalLimits* lease_polls,
                   WorkerQuarantine* quarantine, PlanningPool* planning)
      : core_(core),
        auth_(auth),
        metrics_(metrics),
        lease_polls_(lease_polls),
        quarantine_(quarantine),
        planning_(planning) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* LeaseTask(grpc::CallbackServerContext* context,
                                      const v1::LeaseTaskRequest* request,
                                      v1::LeaseTaskResponse* response) override;
  grpc::Status FetchModel(
      grpc::ServerContext* context, const v1::FetchModelRequest* request,
      grpc::ServerWriter<v1::FetchModelChunk>* writer) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportProfile(
      grpc::CallbackServerContext* context,
      const v1::ReportProfileRequest* request,
      v1::ReportResponse* response) override;
  grpc::Status ReportValidation(grpc::ServerContext* context,
                                const v1::ReportValidationRequest* request,
                                v1::ReportResponse* response) override;
  grpc::Status FailTask(grpc::ServerContext* context,
                        const v1::FailTaskRequest* request,
                        v1::ReportResponse* response) override;

 private:
  JobCore* core_;
  const auth::Authorizer* auth_;
  ServerMetrics* metrics_;
  PrincipalLimits* lease_polls_;
  WorkerQuarantine* quarantine_;
  PlanningPool* planning_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_SERVICES_H_
