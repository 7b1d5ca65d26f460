// JobCore: the state of mutwo-server that the RPC handlers call into (they
// stay thin: validate, call, map the status). It owns the job state machine
//   QUEUED -> PROFILING -> PLANNING -> VALIDATING -> SUCCEEDED | FAILED
//   (CANCELLED from any non-final state)
// on top of the Store (all state durable there, so a restarted server picks
// every job up where it was), the closed loop of validations (closed_loop.h: a
// budget fits only once a worker measured it within the budget; a round
// over the budget is re-planned and validated again, at most
// `max_validation_rounds` rounds; the verdict per batch size and budget is
// BatchResult.outcomes), the schedule cache (schedule_cache.h) and the
// metrics. Task leasing (long polls, heartbeats, fencing, the reaper) is
// Leasing's (leasing.h); WatchJob's waiting is JobWatch's (job_watch.h) in
// the watchers' WaiterSet owned here: neither holds a thread while it waits.
//
// Planning is injected (PlanFn, MaxBatchFn) so the core can be tested with
// the real planner or a fake.
//
// The core delegates each job to a collaborator or a file of its own:
// uploads to UploadSessions (upload_sessions.h); the guard every report
// passes, and the failing of a task whose report is refused, to TaskReports
// (task_reports.h); a job's state from its tasks to SettleJobIn
// (job_settling.h); what a valid spec is to job_rules.h; the max batch
// checks' schedules to max_batch_plans.h. Its own methods are split by job:
// job_core.cc (lifecycle, the Planner service, workers, settling glue),
// job_planning.cc (planning through the schedule cache), profile_reports.cc
// and validation_reports.cc (what each report changes).
//
// Ownership: the store and the metrics are not owned and outlive the core;
// the core owns its collaborators.
// Thread safety: every public method is thread-safe. Start() starts the
// reaper; Shutdown() stops it and ends every long poll and watch.
// Errors: InvalidArgument naming the bad input, NotFound for an unknown
// job, task or model, FailedPrecondition or PermissionDenied for a report
// or a failure of a lease the caller does not hold, ResourceExhausted
// naming the limit passed and its flag, and the store's errors.
#ifndef MUTWO_SERVER_JOB_CORE_H_
#define MUTWO_SERVER_JOB_CORE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mutwo/v1/planner.pb.h"
#include "mutwo/v1/types.pb.h"
#include "mutwo/v1/worker_hub.pb.h"
#include "planner/interrupt.h"
#include "server/closed_loop.h"
#include "server/leasing.h"
#include "server/metrics.h"
#include "server/profile_limits.h"
#include "server/profile_trust.h"
#include "server/schedule_cache.h"
#include "server/task_reports.h"
#include "server/upload_sessions.h"
#include "server/waiters.h"
#include "storage/store.h"

namespace mutwo {

// What JobCore asks the planner for.
struct PlanRequest {
  v1::MemoryBudget budget;
  v1::Policy policy = v1::MUTWO;
  bool include_pareto = false;
  // Plan this many bytes below the budget (Schedule.correction_bytes),
  // learned by the closed loop.
  int64_t correction_bytes = 0;
  // Stops planning (time allowed, caller gone); not owned, may be null.
  planner::Interrupt* interrupt = nullptr;
};
// Plans one schedule for a profile (planner through its proto
// conversion).
using PlanFn = std::function<absl::StatusOr<v1::Schedule>(
    const v1::Profile& profile, const PlanRequest& request)>;
// The real planner (planner::PlanSchedule), with `pareto_points` budgets in
// the Pareto sweep when the request includes it.
PlanFn PlannerPlanFn(int pareto_points);
// Predicts the largest batch from profiles at several batch sizes.
// capacity_bytes 0: the predictor's default (95% of the device).
using MaxBatchFn = std::function<absl::StatusOr<v1::MaxBatchPrediction>(
    const std::vector<v1::Profile>& profiles, int64_t capacity_bytes,
    double max_overhead)>;
// The real predictor (planner::PredictMaxBatchProto).
MaxBatchFn PlannerMaxBatchFn();

class JobCore {
 public:
  static constexpr int64_t kMaxChunkBytes = UploadSession::kMaxChunkBytes;

  struct Options {
    int64_t lease_timeout_ms = 30000;
    int max_attempts = 3;
    int64_t max_model_bytes = int64_t{512} << 20;
    int max_concurrent_jobs = 0;       // 0: unlimited
    int64_t worker_lost_after_ms = 0;  // 0: 3 x lease timeout
    // LOST and STOPPED workers are forgotten (deleted) this long after their
    // last heartbeat.
    int64_t worker_forget_after_ms = 60 * 60 * 1000;
    int64_t reaper_interval_ms = 500;
    int64_t max_lease_wait_ms = 30000;
    // Validation rounds per batch size and budget, the first included.
    int max_validation_rounds = 3;
    // Added to a round's measured overshoot when re-planning, as a fraction
    // of the budget.
    double replan_margin_fraction = 0.01;
    // Time allowed to plan one schedule (with its Pareto curve); past it
    // the request fails with DeadlineExceeded (--max_plan_ms).
    int64_t max_plan_ms = 10000;
    // Uploads running at once per principal, and their declared bytes
    // together (0: 2 x max_model_bytes).
    int max_uploads_per_client = 2;
    int64_t max_upload_bytes_per_client = 0;
    // Long waits held at once (--max_lease_waiters, --max_watchers); past
    // them LeaseTask and WatchJob are refused with RESOURCE_EXHAUSTED and
    // a retry hint of waiter_retry_after_ms.
    int max_lease_waiters = 1000;
    int max_watchers = 1000;
    int64_t waiter_retry_after_ms = 1000;
    // Time allowed to plan one profile report as a whole, the knee and
    // every budget (--max_report_plan_ms); each plan is also bounded by
    // max_plan_ms.
    int64_t max_report_plan_ms = 30000;
    // The serialized size of a job's results, every batch size's together
    // (--max_job_result_bytes): what GetJob answers and every write of the
    // job copies. A report whose schedules would pass it is cut. 4 MiB is
    // what a gRPC client receives by default; at 16 MiB the dense
    // 16,384-node report's process peaked at 1,048 MiB.
    int64_t max_job_result_bytes = int64_t{4} << 20;
    // The largest profile a report may carry (profile_limits.h).
    ProfileLimits profile_limits;
    // When a schedule is shared across tenants (profile_trust.h).
    ProfileTrustOptions profile_trust;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<JobCore>> Create(
      Options options, storage::Store* store, ServerMetrics* metrics,
      PlanFn plan, MaxBatchFn max_batch);
  ~JobCore();
  void Start();
  void Shutdown();

  // Planner service. Who may call what is decided before the core is called
  // (server/auth/authorizer.h); the core records the identities it is given:
  // the uploader of a model, the owner of a job ('' when authentication is
  // off), the principal a worker id is bound to.
  // A new upload of `principal`, streamed to a temp file of the store.
  // ResourceExhausted when the principal already runs
  // Options::max_uploads_per_client uploads; its Header() is refused when
  // the declared sizes of the principal's running uploads would pass
  // Options::max_upload_bytes_per_client.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<UploadSession>> NewUpload(
      const std::string& principal);
  [[nodiscard]] absl::StatusOr<v1::UploadModelResponse> StoreUpload(
      UploadSession& upload, const std::string& uploader = "");
  [[nodiscard]] absl::StatusOr<v1::SubmitJobResponse> SubmitJob(
      const v1::SubmitJobRequest& request, const std::string& owner = "");
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Jobs of `owner` only, or of everyone when nullopt.
  [[nodiscard]] absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request,
      const std::optional<std::string>& owner = std::nullopt);
  [[nodiscard]] absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  [[nodiscard]] absl::StatusOr<v1::Profile> GetProfile(
      const v1::GetProfileRequest& request);
  // `cancelled` (may be empty) tells whether the caller left; planning
  // then stops within a poll (Cancelled).
  [[nodiscard]] absl::StatusOr<v1::Schedule> GetSchedule(
      const v1::GetScheduleRequest& request,
      std::function<bool()> cancelled = nullptr);
  [[nodiscard]] absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  // A schedule measured in a training loop, reported by `reported_by`:
  // judged and stored with the job (server/training_loop.h), the model's
  // training-loop gauges published.
  [[nodiscard]] absl::StatusOr<v1::ReportTrainingLoopResponse>
  ReportTrainingLoop(const v1::ReportTrainingLoopRequest& request,
                     const std::string& reported_by);
  // The job's tasks (WatchJob's progress: what is leased, what ended).
  [[nodiscard]] absl::StatusOr<std::vector<v1::Task>> ListTasks(
      const std::string& job_id);
  // Registers a WatchJob stream (which must live until it finished) and
  // returns its id for WakeWatch. ResourceExhausted (with
  // WaiterSet::RetryAfterMs) when max_watchers already watch, Unavailable
  // when shutting down.
  [[nodiscard]] absl::StatusOr<uint64_t> AddWatch(WaiterSet::Waiter* watch);
  // Wakes watch `id` (its write completed, or kCancelled: its client left).
  void WakeWatch(uint64_t id, WaiterSet::Why why);
  // Blocks until the job's version differs from `seen_version` (Job.version
  // grows with every stored change), `timeout_ms` passes or the core shuts
  // down; returns the current job.
  [[nodiscard]] absl::StatusOr<v1::Job> WaitForJobChange(
      const std::string& job_id, int64_t seen_version, int64_t timeout_ms);
  // True once Shutdown() began: long waits (WatchJob) end instead of
  // polling a core that no longer changes.
  bool stopping();

  // WorkerHub service. Heartbeats, reports and FailTask are accepted only
  // from the worker id that holds the task's lease (PermissionDenied). A
  // report whose content is refused (over a profile limit, malformed, the
  // wrong kind for its task) fails the lease holder's task at once with the
  // refusal's reason (TaskReports::Refuse) and returns the refusal.
  // PermissionDenied when the request names a live worker id registered by
  // another principal.
  [[nodiscard]] absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request,
      const std::string& principal = "");
  // Leasing (long polls without a thread: Leasing::StartPoll).
  Leasing& leasing() { return *leasing_; }
  // A long poll that blocks the caller (Leasing::LeaseTask). `cancelled`
  // (may be empty) tells whether the caller left: the wait ends, and a task
  // leased for a caller that left is given back at once (not left to
  // expire). FailedPrecondition for a STOPPED worker.
  [[nodiscard]] absl::StatusOr<v1::LeaseTaskResponse> LeaseTask(
      const v1::LeaseTaskRequest& request,
      std::function<bool()> cancelled = nullptr) {
    return leasing_->LeaseTask(request, std::move(cancelled));
  }
  [[nodiscard]] absl::StatusOr<std::string> ModelPath(
      const std::string& sha256);
  [[nodiscard]] absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) {
    return leasing_->Heartbeat(request);
  }
  // Plans the knee and every budget within Options::max_report_plan_ms in
  // all (past it the remaining plans are cut, the result says so); stops
  // within a planner step once `cancelled` (may be empty: the worker's call
  // ended or the server drains) turns true, returning Cancelled with
  // nothing stored (the task stays leased; the worker may report again).
  [[nodiscard]] absl::Status ReportProfile(
      const v1::ReportProfileRequest& request,
      const std::function<bool()>& cancelled = nullptr);
  [[nodiscard]] absl::Status ReportValidation(
      const v1::ReportValidationRequest& request);
  [[nodiscard]] absl::Status FailTask(const v1::FailTaskRequest& request);

  // One reaper pass (also called by tests).
  void Reap() { leasing_->Reap(); }
  // Settles every unfinished job once (Start() does, after a restart), so a
  // job whose last change was cut short cannot stay non-final forever.
  absl::Status RecoverUnfinishedJobs();

 private:
  JobCore(Options options, storage::Store* store, ServerMetrics* metrics,
          PlanFn plan, MaxBatchFn max_batch);
  // Plans `profile` (the whole schedule, with the Pareto curve), timing the
  // planner. FailedPrecondition for a profile that ran out of memory.
  // `deadline` bounds the plan besides max_plan_ms (a report's budget).
  absl::StatusOr<v1::Schedule> Plan(
      const v1::Profile& profile, const v1::MemoryBudget& budget,
      v1::Policy policy, int64_t correction_bytes,
      const std::function<bool()>& cancelled = nullptr,
      absl::Time deadline = absl::InfiniteFuture());
  // The schedule for (job spec, batch, device, budget, policy) from the
  // cache, or planned from the profile `load_profile` returns (only called on
  // a miss) and cached.
  // A schedule cache entry written after the transaction that made it
  // valid committed (a report that is refused must not leave a plan from
  // its profile in the cache).
  struct CachePut {
    storage::ScheduleCacheKey key;
    std::string job_id;
    v1::Schedule schedule;
  };
  // Whose cache entries a job's planning reads and writes: the job's owner,
  // the digest of the job's profile and the worker that measured it (all in
  // the key: schedule_key.h), and whether shared entries may answer it or
  // be written from it (profile_trust.h).
  struct CacheOwner {
    std::string tenant;
    std::string profile_sha256;
    std::string measured_by;  // `principal/worker_id`
    bool use_shared = false;
    bool share = false;
  };
  storage::ScheduleCacheKey OwnKey(const v1::JobSpec& spec, int64_t batch_size,
                                   const v1::DeviceInfo& device,
                                   const v1::MemoryBudget& budget,
                                   v1::Policy policy, const CacheOwner& owner);
  // With `deferred`, a planned schedule is added there instead of cached.
  // The job's own entry first; then, with owner.use_shared, a shared one
  // (copied to the job's own key, so the closed loop marks the job's copy);
  // else planned from the profile, and written shared too with owner.share.
  absl::StatusOr<v1::Schedule> PlanCached(
      const v1::JobSpec& spec, const std::string& job_id,
      const CacheOwner& owner, int64_t batch_size, const v1::DeviceInfo& device,
      const std::function<absl::StatusOr<v1::Profile>()>& load_profile,
      const v1::MemoryBudget& budget, v1::Policy policy, bool include_pareto,
      bool include_timeline, std::vector<CachePut>* deferred = nullptr,
      const std::function<bool()>& cancelled = nullptr,
      absl::Time deadline = absl::InfiniteFuture());
  void ApplyCachePuts(const std::vector<CachePut>& puts);
  // A report of `task` whose content was refused with `refusal`:
  // TaskReports::Refuse (the task failed at once when the reporter holds
  // it), then the settled job's gauges and waiters. Returns `refusal`.
  absl::Status RefuseReport(const v1::Task& task, const ReportKey& key,
                            absl::Status refusal);
  // After a report's transaction committed: its cache entries, the settled
  // job's gauges and log line, the model's metrics, the waiters.
  void FinishReport(const v1::Job& job,
                    const std::vector<CachePut>& cache_puts);

  // Profile reports (profile_reports.cc).
  // Why `profile` is not taken for `task` (the wrong kind of task or batch
  // size, over the profile limits, malformed); OK when it is.
  absl::Status CheckProfileReport(const v1::Task& task,
                                  const v1::Profile& profile);
  // Shows the job PLANNING while the last pending profile is planned.
  absl::Status ShowPlanning(const v1::Job& job, const v1::Task& task);
  // What a profile report plans before its transaction: the batch size's
  // result, the VALIDATE rounds to queue and the cache entries to write.
  struct ProfilePlans {
    ProfileTrust trust;
    // Its schedules (each feasible one is validated) and the cache entries
    // written once the report is stored.
    v1::BatchResult result;
    std::vector<CachePut> cache_puts;
  };
  // The report's bounds: its deadline and whether to stop.
  struct ReportBounds {
    absl::Time deadline = absl::InfiniteFuture();
    std::function<bool()> cancelled;
    // What the planning may hold (ProfileLimits::max_report_plan_bytes) and
    // what one plan needs while it runs (PlanningWorkingBytes).
    int64_t max_plan_bytes = 0;
    int64_t working_bytes = 0;
  };
  ProfilePlans PlanBatchResult(const v1::Job& job, const v1::Task& task,
                               const v1::Profile& profile, ProfileTrust trust,
                               const ReportBounds& bounds);
  // Who measured the reported profile and whether the cache may share it
  // (profile_trust.h), judged against the stored measurements of its key.
  absl::StatusOr<ProfileTrust> JudgeReport(const v1::Job& job,
                                           const v1::Task& task,
                                           const std::string& worker_id,
                                           const v1::Profile& profile);
  // The report's transaction, with the max batch prediction over every
  // profile (predicted again when another profile was stored meanwhile);
  // `job` is set to the job as settled.
  // The profile's measurement row is judged again and stored inside it;
  // `plans.trust` becomes that judgement (shared entries dropped when it no
  // longer allows them).
  absl::Status StoreProfileReport(const ReportKey& key, const v1::Task& task,
                                  const v1::Profile& profile,
                                  ProfilePlans& plans, v1::Job& job,
                                  bool* retried);
  absl::Status WriteProfileResult(
      storage::Store::Writer& w, const v1::Task& task,
      const ProfilePlans& plans,
      const std::optional<v1::MaxBatchPrediction>& prediction,
      const std::vector<v1::Schedule>& to_verify, v1::Job& job);

  // Validation reports (validation_reports.cc).
  // The closed loop after round `round` of VALIDATE `task` measured
  // `validation`: the outcome for its (batch, budget), settled or with the
  // next round queued (re-planned with the correction learned), and the
  // schedule the job result shows for it (the re-planned one, or the one
  // that ran marked with its measurement). Keeps the schedule cache in step.
  // Nothing is written: the caller stores the outcome, queues
  // `next_round` and applies `cache_puts` with the report.
  struct RoundResult {
    v1::BudgetOutcome outcome;
    v1::Schedule schedule;
    std::optional<v1::Schedule> next_round;  // the next VALIDATE task's
    std::string metric_result;
  };
  absl::StatusOr<RoundResult> CloseRound(const v1::Job& job,
                                         const v1::Task& task,
                                         const v1::Validation& validation,
                                         int round, v1::BudgetOutcome outcome,
                                         std::vector<CachePut>* cache_puts);
  // The floor, Pareto curve and knee of `profile` into `result` (the knee's
  // schedule planned through the cache, so `--budget auto` is served).
  absl::Status AnswerMemory(const v1::Job& job, const CacheOwner& owner,
                            int64_t batch_size, const v1::Profile& profile,
                            v1::BatchResult& result,
                            std::vector<CachePut>* cache_puts,
                            const ReportBounds& bounds);
  // A MAX_BATCH task's step: its check verified, failed, or stepped down
  // with the next step queued (max_batch_check.h).
  absl::Status ReportMaxBatchStep(const v1::ReportValidationRequest& request,
                                  const v1::Task& task);
  // Marks the cache entry of the schedule `task` ran with `measured_bytes`
  // (over the budget: infeasible with `reason`), unless the entry is
  // another plan by now.
  absl::Status RecordMeasurement(const v1::Job& job, const v1::Task& task,
                                 int64_t measured_bytes,
                                 const std::string& reason,
                                 std::vector<CachePut>* cache_puts);
  // Recomputes the job's state and counters from its tasks after any task
  // change (a failed or cancelled VALIDATE task fails its budget's
  // outcome), and finishes the job when no task is left to run.
  // `refresh_gauges` false on the lease path: the gauges read every worker,
  // and the reaper refreshes them twice a second anyway.
  absl::Status Settle(const std::string& job_id, bool refresh_gauges = true);
  // Settle's decision inside the caller's transaction, so a report, a
  // submit or a cancel changes its tasks and its job state together.
  absl::StatusOr<v1::Job> SettleIn(storage::Store::Writer& w,
                                   const std::string& job_id);
  // Gauges and the final-state log line after a settled job committed.
  void AfterSettle(const v1::Job& job, bool refresh_gauges = true);
  void NotifyChange();
  void RefreshGauges();
  // Sets job.waiting (see types.proto) for an unfinished job with queued
  // tasks that no live worker can run; best effort (a store error leaves it
  // empty).
  void AnnotateWaiting(v1::Job& job);
  void PublishModelMetrics(const v1::Job& job);

  // Immutable facts kept in memory for the GetSchedule hot path (a job's
  // spec, the device of a stored profile): bounded maps, cleared when full.
  // A job's spec and owner (the rest of the Job left empty).
  absl::StatusOr<std::shared_ptr<const v1::Job>> JobFactsOf(
      const std::string& job_id);
  absl::StatusOr<std::shared_ptr<const v1::DeviceInfo>> ProfileDeviceOf(
      const std::string& job_id, int64_t batch_size);
  // The cache owner of the job's stored profile at `batch_size` (its
  // measurement row; for a profile stored before measurements were kept, its
  // digest and no worker). Neither shares nor uses shared entries: only a
  // profile report, which judges the profile, does.
  absl::StatusOr<std::shared_ptr<const CacheOwner>> ProfileOwnerOf(
      const std::string& job_id, const std::string& tenant, int64_t batch_size);
  static constexpr size_t kHotCacheEntries = 4096;

  Options options_;
  ClosedLoopOptions loop_options_;
  storage::Store* store_;
  ServerMetrics* metrics_;
  PlanFn plan_;
  MaxBatchFn max_batch_;
  ScheduleCache cache_;
  UploadSessions uploads_;
  TaskReports reports_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Leasing> leasing_;
  std::unique_ptr<WaiterSet> watchers_;

  absl::Mutex hot_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Job>> hot_jobs_
      ABSL_GUARDED_BY(hot_mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::DeviceInfo>>
      hot_devices_ ABSL_GUARDED_BY(hot_mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const CacheOwner>>
      hot_owners_ ABSL_GUARDED_BY(hot_mu_);
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_JOB_CORE_H_
