// MutwoServer owns everything mutwo-server runs: the Store, the JobCore (and
// its reaper), the gRPC server with the Planner and WorkerHub services,
// health checking (grpc.health.v1: SERVING, NOT_SERVING while draining) and
// reflection, and the Prometheus endpoint on its own port. The gRPC port is
// secured as server/auth/server_security.h says (tokens, TLS, or neither on
// loopback only); Create refuses an unsafe combination.
// Start() binds and returns; Shutdown(deadline) flips health to NOT_SERVING,
// stops accepting, lets in-flight RPCs finish until the deadline, then stops
// the core and closes the store. Thread-safe: Shutdown may be called from
// any thread; it is idempotent.
#ifndef MUTWO_SERVER_SERVER_H_
#define MUTWO_SERVER_SERVER_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics_exposer.h"
#include "grpcpp/server.h"
#include "server/auth/authorizer.h"
#include "server/auth/server_security.h"
#include "server/job_core.h"
#include "server/metrics.h"
#include "server/planning_pool.h"
#include "server/principal_limits.h"
#include "server/services.h"
#include "server/upload_quota.h"
#include "server/upload_watchdog.h"
#include "server/worker_quarantine.h"
#include "storage/store.h"

namespace mutwo {

class MutwoServer {
 public:
  struct Options {
    std::string listen = "127.0.0.1:50051";
    std::string metrics_listen = "127.0.0.1:9464";  // empty: no metrics
    std::string data_dir = "./mutwo-data";
    auth::ServerSecurityOptions security;
    JobCore::Options core;
    // Threads that serve the synchronous RPCs (all but LeaseTask and
    // WatchJob, which wait without one); 0: gRPC's default.
    int max_rpc_threads = 0;
    // Long waits one principal may hold at once (principal_limits.h):
    // WatchJob streams of a client, LeaseTask polls of a worker token.
    int max_watchers_per_client = 250;
    int max_lease_waiters_per_worker = 250;
    // Bytes of models one principal may keep, and overrides per principal
    // (upload_quota.h); an upload silent this long is dropped
    // (upload_watchdog.h).
    int64_t max_stored_model_bytes_per_client = int64_t{4} << 30;
    absl::flat_hash_map<std::string, int64_t> model_quota_overrides;
    int64_t upload_idle_timeout_ms = 30000;
    // Failures of one worker id within a window that stop leasing to it
    // for a while (worker_quarantine.h); failures 0: never.
    int worker_quarantine_failures = 10;
    int64_t worker_quarantine_window_ms = 10 * 60 * 1000;
    int64_t worker_quarantine_ms = 60 * 60 * 1000;
    // Profile reports planned at once and waiting (planning_pool.h:
    // --planning_threads, --max_queued_reports).
    int planning_threads = 2;
    int max_queued_reports = 8;
    PlanFn plan;
    MaxBatchFn max_batch;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MutwoServer>> Create(
      Options options);

  // Opens the store, binds both ports; port()/metrics_port() are the ports
  // bound (useful with port 0). The gRPC port is bound without SO_REUSEPORT.
  // Either port: AlreadyExists naming the port when another process holds
  // it; InvalidArgument (gRPC) or Unavailable (metrics) when the address
  // cannot be bound otherwise.
  [[nodiscard]] absl::Status Start();
  int port() const { return port_; }
  int metrics_port() const {
    return metrics_ != nullptr ? metrics_->port() : 0;
  }
  void Shutdown(absl::Duration drain_timeout);
  ~MutwoServer();

 private:
  MutwoServer(Options options, auth::ServerSecurity security)
      : options_(std::move(options)), security_(std::move(security)) {}
  // At most `max` of `what` per principal (--`flag_name`), refusals counted
  // under `flag_name`.
  absl::StatusOr<std::unique_ptr<PrincipalLimits>> LimitPerPrincipal(
      const std::string& what, const std::string& flag_name, int max);
  Options options_;
  auth::ServerSecurity security_;
  int port_ = 0;
  std::unique_ptr<storage::Store> store_;
  ServerMetrics server_metrics_;
  std::unique_ptr<JobCore> core_;
  std::unique_ptr<auth::Authorizer> authorizer_;
  // Before the services and the gRPC server: every Slot, held by a call,
  // is given back before these go.
  std::unique_ptr<PrincipalLimits> watches_per_client_;
  std::unique_ptr<PrincipalLimits> lease_polls_per_worker_;
  std::unique_ptr<UploadQuota> stored_models_;
  std::unique_ptr<UploadWatchdog> idle_uploads_;
  std::unique_ptr<WorkerQuarantine> quarantine_;
  std::unique_ptr<PlanningPool> planning_;
  std::unique_ptr<PlannerService> planner_service_;
  std::unique_ptr<WorkerHubService> hub_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_SERVER_H_
