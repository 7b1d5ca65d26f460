// WorkerDaemon: the long-running side of `mutwo-worker serve`. It registers
// with mutwo-server, long-polls WorkerHub.LeaseTask, caches models by sha256
// (verified), runs each task as a child process of the mutwo-worker
// executable (`run-task`) under memory and wall-clock limits, heartbeats while
// it runs (killing the child when the lease is lost or the job cancelled),
// and reports the child's result (or fails the attempt with the reason).
// Reconnects with exponential backoff and jitter. This library does not see
// LibTorch: device facts come from the injected `probe_device` and
// `device_memory` functions.
//
// Thread safety: Run() runs on one thread; Shutdown() may be called from any
// other thread; it stops leasing, kills a running child and hands its lease
// back (FailTask, retryable) so another worker picks the task up at once.
#ifndef MUTWO_WORKER_DAEMON_DAEMON_H_
#define MUTWO_WORKER_DAEMON_DAEMON_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/credentials.h"
#include "mutwo/v1/types.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/daemon/child_process.h"

namespace mutwo {

struct DeviceMemory {
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
};

class WorkerDaemon {
 public:
  struct Options {
    std::string server = "127.0.0.1:50051";
    // Token and TLS files (common/credentials.h); the target is `server`.
    ClientCredentialsOptions credentials;
    std::string device = "cpu";  // passed to the child: cpu | cuda:N
    // Passed to the child: --specialize_control_flow (worker/specialize.h).
    bool specialize_control_flow = false;
    std::string work_dir;         // model cache and task files
    std::string self_executable;  // the mutwo-worker binary
    // RLIMIT_AS of a CPU task process; 0: none. Default: half the machine's
    // memory (DefaultTaskLimits).
    int64_t task_memory_limit_bytes = DefaultTaskLimits().memory_limit_bytes;
    int64_t task_time_limit_ms = DefaultTaskLimits().wall_limit_ms;
    int64_t lease_wait_ms = 10000;
    int64_t rpc_timeout_ms = 30000;
    int64_t max_backoff_ms = 30000;
    int max_tasks = 0;  // stop after this many tasks (tests); 0: unlimited
    std::function<absl::StatusOr<v1::DeviceInfo>()> probe_device;
    std::function<DeviceMemory()> device_memory;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Create(
      Options options);

  // Metrics of this worker (tasks, durations, device memory).
  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }

  // Runs until Shutdown() or max_tasks; returns the last fatal error if any.
  absl::Status Run();
  void Shutdown();
  // Tells the server this worker stops (Heartbeat with `stopping`), so it
  // is leased nothing more; Run() does it on its way out.
  void Deregister();

 private:
  explicit WorkerDaemon(Options options);
  absl::Status Register();
  absl::Status RunOneTask(const v1::LeaseTaskResponse& lease);
  absl::StatusOr<std::string> EnsureModel(const std::string& sha256);
  void RefreshDeviceGauges();
  void Backoff(int attempt);
  // Waits the server's retry hint (RESOURCE_EXHAUSTED with
  // grpc-retry-pushback-ms), plus jitter; stops early when told to stop.
  void Pause(int64_t hint_ms);
  // Sleeps `wait_ms`, stopping early when told to stop.
  void Sleep(int64_t wait_ms);
  std::chrono::system_clock::time_point Deadline(int64_t ms) const;

  Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerHub::Stub> stub_;
  v1::WorkerInfo info_;
  int64_t heartbeat_interval_ms_ = 2000;
  std::atomic<bool> stopping_{false};
  // The long RPC in progress (Register, LeaseTask), cancelled by Shutdown()
  // so the daemon stops at once even while the server is unreachable.
  absl::Mutex call_mu_;
  grpc::ClientContext* active_call_ ABSL_GUARDED_BY(call_mu_) = nullptr;
  void SetActiveCall(grpc::ClientContext* context);
  absl::Notification stopped_;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& tasks_total_;
  prometheus::Family<prometheus::Histogram>& task_seconds_;
  prometheus::Gauge& memory_used_;
  prometheus::Gauge& memory_total_;
  prometheus::Gauge& busy_;
};

}  // namespace mutwo

#endif  // MUTWO_WORKER_DAEMON_DAEMON_H_
