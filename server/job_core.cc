#include "server/job_core.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/model_archive.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/device_wait.h"
#include "server/job_rules.h"
#include "server/job_settling.h"
#include "server/training_loop.h"

namespace mutwo {
namespace {

absl::Status ValidateOptions(const JobCore::Options& options) {
  if (options.lease_timeout_ms < 100) {
    return absl::InvalidArgumentError("lease timeout must be at least 100 ms");
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("max attempts must be at least 1");
  }
  if (options.max_validation_rounds < 1) {
    return absl::InvalidArgumentError(
        "max validation rounds must be at least 1");
  }
  if (!(options.replan_margin_fraction >= 0 &&
        options.replan_margin_fraction < 1)) {
    return absl::InvalidArgumentError(
        "the re-plan margin must be a fraction of the budget in [0, 1)");
  }
  if (options.max_plan_ms <= 0) {
    return absl::InvalidArgumentError("max_plan_ms must be positive");
  }
  if (options.max_report_plan_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_report_plan_ms must be positive, got ",
                     options.max_report_plan_ms));
  }
  if (options.profile_limits.max_nodes < 1 ||
      options.profile_limits.max_edges < 1) {
    return absl::InvalidArgumentError(
        "--max_profile_nodes and --max_profile_edges must be positive");
  }
  if (options.profile_limits.max_report_plan_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_report_plan_bytes must be positive, got ",
                     options.profile_limits.max_report_plan_bytes));
  }
  if (options.max_job_result_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_job_result_bytes must be positive, got ",
                     options.max_job_result_bytes));
  }
  MUTWO_RETURN_IF_ERROR(ValidateProfileTrustOptions(options.profile_trust));
  return absl::OkStatus();
}

Leasing::Options LeasingOptions(const JobCore::Options& options) {
  Leasing::Options lease_options;
  lease_options.lease_timeout_ms = options.lease_timeout_ms;
  lease_options.max_attempts = options.max_attempts;
  lease_options.worker_lost_after_ms = options.worker_lost_after_ms;
  lease_options.worker_forget_after_ms = options.worker_forget_after_ms;
  lease_options.reaper_interval_ms = options.reaper_interval_ms;
  lease_options.max_lease_wait_ms = options.max_lease_wait_ms;
  lease_options.max_lease_waiters = options.max_lease_waiters;
  lease_options.waiter_retry_after_ms = options.waiter_retry_after_ms;
  return lease_options;
}

UploadSessions::Options UploadOptions(const JobCore::Options& options) {
  UploadSessions::Options upload_options;
  upload_options.max_model_bytes = options.max_model_bytes;
  upload_options.max_uploads_per_client = options.max_uploads_per_client;
  upload_options.max_upload_bytes_per_client =
      options.max_upload_bytes_per_client;
  return upload_options;
}

WaiterSet::Options WatchOptions(const JobCore::Options& options,
                                ServerMetrics* metrics) {
  WaiterSet::Options watch_options;
  watch_options.what = "WatchJob streams";
  watch_options.flag = "--max_watchers";
  watch_options.max_waiters = options.max_watchers;
  watch_options.retry_after_ms = options.waiter_retry_after_ms;
  watch_options.observe_waiting = [metrics](int n) {
    metrics->SetLongWaits("watch", n);
  };
  watch_options.observe_refused = [metrics] {
    metrics->CountLongWaitRefused("watch");
  };
  return watch_options;
}

// Whether the stored model at `path` can take the job's inputs, read from
// the archive's code without loading it (common/model_archive.h): a job the
// worker would fail at once (a pickle, a corrupt file, an input missing or
// naming no argument) is refused before it is queued, with the message the
// worker would give. What the check cannot read (unusual code, a file it
// cannot map) does not refuse the job: the worker decides.
absl::Status CheckModelTakesInputs(const std::string& path,
                                   const v1::JobSpec& spec) {
  // The worker names the model so (worker/task_commands.cc).
  const std::string what = spec.model_name().empty()
                               ? spec.model_sha256()
                               : absl::StrCat(spec.model_name(), ".pt");
  ForwardSchema schema;
  const absl::Status checked = CheckModelFileInputs(
      path, what,
      std::vector<v1::TensorSpec>(spec.inputs().begin(), spec.inputs().end()),
      &schema);
  if (checked.code() == absl::StatusCode::kInvalidArgument) return checked;
  if (!checked.ok()) {
    MUTWO_LOG(warn, "model {}: not checked before queueing: {}", what,
              std::string(checked.message()));
  } else if (!schema.known) {
    MUTWO_LOG(info,
              "model {}: forward's arguments not read from its code ({}); "
              "the worker checks the inputs",
              what, schema.unknown_reason);
  }
  return absl::OkStatus();
}

}  // namespace

JobCore::JobCore(Options options, storage::Store* store, ServerMetrics* metrics,
                 PlanFn plan, MaxBatchFn max_batch)
    : options_(options),
      loop_options_{options.max_validation_rounds,
                    options.replan_margin_fraction},
      store_(store),
      metrics_(metrics),
      plan_(std::move(plan)),
      max_batch_(std::move(max_batch)),
      cache_(store, metrics),
      uploads_(UploadOptions(options), store),
      reports_(store, options.max_attempts, SettleJobIn) {}

absl::StatusOr<std::unique_ptr<JobCore>> JobCore::Create(Options options,
                                                         storage::Store* store,
                                                         ServerMetrics* metrics,
                                                         PlanFn plan,
                                                         MaxBatchFn max_batch) {
  if (store == nullptr || metrics == nullptr || !plan || !max_batch) {
    return absl::InvalidArgumentError(
        "JobCore needs a store, metrics and a planner");
  }
  MUTWO_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.worker_lost_after_ms <= 0) {
    options.worker_lost_after_ms = 3 * options.lease_timeout_ms;
  }
  std::unique_ptr<JobCore> core(new JobCore(
      options, store, metrics, std::move(plan), std::move(max_batch)));
  // Leasing calls back into the job state machine after a task changed
  // hands.
  JobCore* c = core.get();
  Leasing::Hooks hooks;
  hooks.settle = [c](const std::string& job_id, bool refresh_gauges) {
    return c->Settle(job_id, refresh_gauges);
  };
  hooks.refresh_gauges = [c] { c->RefreshGauges(); };
  hooks.notify_change = [c] { c->NotifyChange(); };
  hooks.observe_waiting_polls = [metrics](int n) {
    metrics->SetLongWaits("lease", n);
  };
  hooks.observe_refused_poll = [metrics] {
    metrics->CountLongWaitRefused("lease");
  };
  MUTWO_ASSIGN_OR_RETURN(
      core->leasing_, Leasing::Create(LeasingOptions(options), store, hooks));
  MUTWO_ASSIGN_OR_RETURN(core->watchers_,
                         WaiterSet::Create(WatchOptions(options, metrics)));
  return core;
}

JobCore::~JobCore() { Shutdown(); }

absl::Status JobCore::RecoverUnfinishedJobs() {
  storage::ListJobsQuery query;
  query.states = {v1::Job::QUEUED, v1::Job::PROFILING, v1::Job::PLANNING,
                  v1::Job::VALIDATING};
  query.page_size = storage::Store::kMaxPageSize;
  std::vector<std::string> ids;
  do {
    MUTWO_ASSIGN_OR_RETURN(storage::JobPage page, store_->ListJobs(query));
    for (const v1::Job& job : page.jobs) ids.push_back(job.job_id());
    query.page_token = page.next_page_token;
  } while (!query.page_token.empty());
  for (const std::string& id : ids) MUTWO_RETURN_IF_ERROR(Settle(id));
  return absl::OkStatus();
}

void JobCore::Start() {
  if (absl::Status s = RecoverUnfinishedJobs(); !s.ok()) {
    MUTWO_LOG(error, "settling unfinished jobs at start: {}", s.ToString());
  }
  RefreshGauges();
  leasing_->Start();
}

void JobCore::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (leasing_ != nullptr) leasing_->Shutdown();
  if (watchers_ != nullptr) watchers_->Shutdown();
}

void JobCore::NotifyChange() {
  {
    absl::MutexLock lock(&mu_);
    ++generation_;
    changed_.SignalAll();
  }
  leasing_->Notify();
  watchers_->Notify();
}

absl::StatusOr<uint64_t> JobCore::AddWatch(WaiterSet::Waiter* watch) {
  return watchers_->Add(watch, absl::InfiniteFuture());
}

void JobCore::WakeWatch(uint64_t id, WaiterSet::Why why) {
  watchers_->Wake(id, why);
}

void JobCore::RefreshGauges() {
  if (auto jobs = store_->CountJobsByState(); jobs.ok()) {
    std::map<std::string, int64_t> m;
    for (const auto& [s, n] : *jobs) m[v1::Job::State_Name(s)] = n;
    metrics_->SetJobs(m);
  }
  if (auto tasks = store_->CountTasksByState(); tasks.ok()) {
    std::map<std::string, int64_t> m;
    for (const auto& [s, n] : *tasks) m[v1::Task::State_Name(s)] = n;
    metrics_->SetTasks(m);
  }
  if (auto workers = store_->ListWorkers(); workers.ok()) {
    std::map<std::string, int64_t> m;
    for (const auto& w : *workers) m[v1::WorkerInfo::State_Name(w.state())]++;
    metrics_->SetWorkers(m);
    if (auto queued = store_->CountJobsWithQueuedTasksByDeviceKind();
        queued.ok()) {
      metrics_->SetJobsWaitingForDevice(
          JobsWaitingForDevice(*queued, *workers));
    }
  }
  if (auto bytes = store_->TotalModelBytes(); bytes.ok()) {
    metrics_->SetModelStoreBytes(*bytes);
  }
}

absl::StatusOr<std::unique_ptr<UploadSession>> JobCore::NewUpload(
    const std::string& principal) {
  return uploads_.Open(principal);
}

absl::StatusOr<v1::UploadModelResponse> JobCore::StoreUpload(
    UploadSession& upload, const std::string& uploader) {
  if (upload.file() == nullptr) {
    return absl::FailedPreconditionError(
        "upload: the session has no file (not made by NewUpload)");
  }
  MUTWO_ASSIGN_OR_RETURN(
      storage::PutModelResult put,
      store_->PutModelFile(upload.header().sha256(), upload.header().name(),
                           upload.header().size_bytes(), *upload.file()));
  MUTWO_RETURN_IF_ERROR(
      store_->RecordModelUpload(upload.header().sha256(), uploader));
  metrics_->CountUpload(!put.already_stored);
  RefreshGauges();
  v1::UploadModelResponse response;
  response.set_sha256(put.info.sha256);
  response.set_size_bytes(put.info.size_bytes);
  response.set_already_stored(put.already_stored);
  return response;
}

absl::StatusOr<v1::SubmitJobResponse> JobCore::SubmitJob(
    const v1::SubmitJobRequest& request, const std::string& owner) {
  const v1::JobSpec& spec = request.spec();
  if (!IsSha256Hex(spec.model_sha256())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_sha256 \"", spec.model_sha256(),
                     "\" is not 64 lowercase hex digits"));
  }
  MUTWO_ASSIGN_OR_RETURN(bool has_model, store_->HasModel(spec.model_sha256()));
  if (!has_model) {
    return absl::NotFoundError(
        absl::StrCat("model ", spec.model_sha256(),
                     " is not uploaded; upload it first (mutwo submit does)"));
  }
  MUTWO_RETURN_IF_ERROR(ValidateSpec(spec));
  MUTWO_ASSIGN_OR_RETURN(const std::string model_path,
                         store_->ModelPath(spec.model_sha256()));
  MUTWO_RETURN_IF_ERROR(CheckModelTakesInputs(model_path, spec));
  // The job, its PROFILE tasks and its first state in one transaction: a
  // submit either stored all of it or nothing, so a retried submit never
  // finds a job without tasks. The concurrency limit is checked inside it
  // too, so concurrent submits cannot all pass it.
  storage::CreateJobResult created;
  MUTWO_RETURN_IF_ERROR(
      store_->Write([&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(
            created, w.CreateJob(spec, request.client_request_id(), owner,
                                 options_.max_concurrent_jobs));
        if (created.deduplicated) return absl::OkStatus();
        for (int64_t b : spec.batch_sizes()) {
          MUTWO_RETURN_IF_ERROR(
              w.AddTask(created.job.job_id(), v1::Task::PROFILE, b).status());
        }
        return SettleIn(w, created.job.job_id()).status();
      }));
  v1::SubmitJobResponse response;
  response.set_deduplicated(created.deduplicated);
  if (!created.deduplicated) {
    MUTWO_LOG(info,
              "job {} submitted: model {} ({}), {} batch sizes, {} budgets",
              created.job.job_id(), spec.model_name(), spec.model_sha256(),
              spec.batch_sizes_size(), spec.budgets_size());
  }
  MUTWO_ASSIGN_OR_RETURN(*response.mutable_job(), GetJob(created.job.job_id()));
  if (!created.deduplicated && !response.job().waiting().empty()) {
    MUTWO_LOG(warn, "job {} waits: {}", response.job().job_id(),
              response.job().waiting());
  }
  RefreshGauges();
  NotifyChange();
  return response;
}

absl::StatusOr<v1::Job> JobCore::GetJob(const std::string& job_id) {
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(job_id));
  AnnotateWaiting(job);
  return job;
}

void JobCore::AnnotateWaiting(v1::Job& job) {
  job.clear_waiting();
  if (IsFinal(job.state())) return;
  auto tasks = store_->ListTasks(job.job_id());
  if (!tasks.ok()) return;
  const bool queued = std::any_of(
      tasks->begin(), tasks->end(),
      [](const v1::Task& t) { return t.state() == v1::Task::QUEUED; });
  if (!queued) return;
  auto workers = store_->ListWorkers();
  if (!workers.ok()) return;
  job.set_waiting(DeviceWaitReason(job.spec().device_kind(), *workers));
}

absl::StatusOr<v1::ListJobsResponse> JobCore::ListJobs(
    const v1::ListJobsRequest& request,
    const std::optional<std::string>& owner) {
  storage::ListJobsQuery query;
  query.owner = owner;
  for (int s : request.states()) query.states.push_back(v1::Job::State(s));
  query.model_sha256 = request.model_sha256();
  query.page_size = request.page_size();
  query.page_token = request.page_token();
  MUTWO_ASSIGN_OR_RETURN(storage::JobPage page, store_->ListJobs(query));
  v1::ListJobsResponse response;
  for (auto& j : page.jobs) *response.add_jobs() = std::move(j);
  response.set_next_page_token(page.next_page_token);
  return response;
}

absl::StatusOr<v1::Job> JobCore::CancelJob(const std::string& job_id) {
  MUTWO_RETURN_IF_ERROR(
      store_->Write([&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_RETURN_IF_ERROR(
            w.UpdateJob(job_id, [&](v1::Job& j) {
               if (IsFinal(j.state())) {
                 return absl::FailedPreconditionError(
                     absl::StrCat("job ", job_id, " is already ",
                                  v1::Job::State_Name(j.state())));
               }
               j.set_state(v1::Job::CANCELLED);
               j.set_error("cancelled by the client");
               return absl::OkStatus();
             }).status());
        MUTWO_RETURN_IF_ERROR(w.CancelJobTasks(job_id).status());
        return SettleIn(w, job_id).status();
      }));
  MUTWO_LOG(info, "job {} cancelled", job_id);
  RefreshGauges();
  NotifyChange();
  return store_->GetJob(job_id);
}

absl::StatusOr<v1::ReportTrainingLoopResponse> JobCore::ReportTrainingLoop(
    const v1::ReportTrainingLoopRequest& request,
    const std::string& reported_by) {
  v1::ReportTrainingLoopResponse response;
  v1::TrainingLoopValidation& report = *response.mutable_report();
  report = request.report();
  report.set_reported_by(reported_by);
  report.set_reported_unix_ms(store_->NowMs());
  v1::Schedule ran;
  MUTWO_ASSIGN_OR_RETURN(
      v1::Job job,
      store_->UpdateJob(request.job_id(), [&](v1::Job& j) -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(*response.mutable_outcome(),
                               AddTrainingLoopReport(j, report, &ran));
        return absl::OkStatus();
      }));
  // Over the budget and otherwise right: the budget planned again below it
  // by what the loop measured over the prediction (the closed loop's rule,
  // with the user's loop as the measurement). Not stored: the job's
  // schedule is the one a worker proved; this one is the caller's to try.
  if (const int64_t correction =
          TrainingLoopCorrection(ran, report, loop_options_.margin_fraction);
      correction > 0) {
    auto profile =
        store_->GetProfile(job.job_id(), report.validation().batch_size());
    auto replanned =
        profile.ok() ? Plan(*profile, ran.budget(), ran.policy(), correction)
                     : absl::StatusOr<v1::Schedule>(profile.status());
    if (!replanned.ok()) {
      response.set_note(
          absl::StrCat("planning again: ", replanned.status().message()));
    } else if (replanned->feasible()) {
      *response.mutable_corrected() =
          ScheduleCache::Trim(*std::move(replanned), /*include_pareto=*/false,
                              /*include_timeline=*/false);
      response.set_note(absl::StrCat(
          "planned again ", FormatBytes(correction),
          " below the budget (what the training loop measured over the "
          "prediction, plus a margin): run the corrected schedule and "
          "report it"));
    } else {
      response.set_note(absl::StrCat(
          "no schedule is predicted to fit ", FormatBytes(correction),
          " below the budget ", FormatBytes(ran.budget_bytes()),
          " (what the training loop measured over the prediction, plus a "
          "margin); floor ",
          FormatBytes(replanned->floor_bytes())));
    }
  }
  MUTWO_LOG(info, "job {} batch {} budget {}: training loop ({}) {}",
            job.job_id(), report.validation().batch_size(),
            FormatBudget(report.budget()),
            v1::TrainingLoopValidation::Path_Name(report.path()),
            report.holds() ? "holds" : report.problem());
  PublishModelMetrics(job);
  NotifyChange();
  return response;
}

absl::StatusOr<v1::Profile> JobCore::GetProfile(
    const v1::GetProfileRequest& request) {
  MUTWO_RETURN_IF_ERROR(store_->GetJob(request.job_id()).status());
  return store_->GetProfile(request.job_id(), request.batch_size());
}

absl::StatusOr<v1::ListWorkersResponse> JobCore::ListWorkers() {
  MUTWO_ASSIGN_OR_RETURN(auto workers, store_->ListWorkers());
  v1::ListWorkersResponse response;
  for (auto& w : workers) *response.add_workers() = std::move(w);
  return response;
}

bool JobCore::stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

absl::StatusOr<v1::Job> JobCore::WaitForJobChange(const std::string& job_id,
                                                  int64_t seen_version,
                                                  int64_t timeout_ms) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  while (true) {
    int64_t generation;
    {
      absl::MutexLock lock(&mu_);
      generation = generation_;
    }
    MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(job_id));
    if (job.version() != seen_version || IsFinal(job.state())) {
      AnnotateWaiting(job);
      return job;
    }
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && generation_ == generation &&
             absl::Now() < deadline) {
        changed_.WaitWithDeadline(&mu_, deadline);
      }
      if (!stopping_ && absl::Now() < deadline) continue;
    }
    AnnotateWaiting(job);
    return job;
  }
}

absl::StatusOr<v1::RegisterWorkerResponse> JobCore::RegisterWorker(
    const v1::RegisterWorkerRequest& request, const std::string& principal) {
  const std::string& kind = request.worker().device().kind();
  if (kind != "cpu" && kind != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker device kind \"", kind, "\": expected cpu or cuda"));
  }
  v1::WorkerInfo info = request.worker();
  info.set_state(v1::WorkerInfo::IDLE);
  MUTWO_ASSIGN_OR_RETURN(v1::WorkerInfo stored,
                         store_->UpsertWorker(info, principal));
  MUTWO_LOG(info, "worker {} registered: {} on {}", stored.worker_id(),
            stored.device().name(), stored.hostname());
  v1::RegisterWorkerResponse response;
  response.set_worker_id(stored.worker_id());
  response.set_heartbeat_interval_ms(
      std::max<int64_t>(100, options_.lease_timeout_ms / 3));
  RefreshGauges();
  return response;
}

absl::StatusOr<std::vector<v1::Task>> JobCore::ListTasks(
    const std::string& job_id) {
  return store_->ListTasks(job_id);
}

absl::StatusOr<std::string> JobCore::ModelPath(const std::string& sha256) {
  MUTWO_ASSIGN_OR_RETURN(bool has, store_->HasModel(sha256));
  if (!has)
    return absl::NotFoundError(
        absl::StrCat("model ", sha256, " is not stored"));
  return store_->ModelPath(sha256);
}

absl::Status JobCore::FailTask(const v1::FailTaskRequest& request) {
  v1::Task task;
  v1::Job job;
  MUTWO_RETURN_IF_ERROR(
      store_->Write([&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(
            task, w.FailTask(request.task_id(), request.fence_token(),
                             request.worker_id(), request.reason(),
                             request.retryable(), options_.max_attempts));
        MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
        return absl::OkStatus();
      }));
  MUTWO_LOG(warn, "task {} attempt {} failed ({}): {}", task.task_id(),
            task.attempt(), v1::Task::State_Name(task.state()),
            request.reason());
  // The worker may have been forgotten (LOST, server restarted): the task
  // state above is what matters.
  (void)store_->TouchWorker(request.worker_id(), v1::WorkerInfo::IDLE, "");
  AfterSettle(job);
  NotifyChange();
  return absl::OkStatus();
}

absl::Status JobCore::Settle(const std::string& job_id, bool refresh_gauges) {
  v1::Job job;
  MUTWO_RETURN_IF_ERROR(
      store_->Write([&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, job_id));
        return absl::OkStatus();
      }));
  AfterSettle(job, refresh_gauges);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobCore::SettleIn(storage::Store::Writer& w,
                                          const std::string& job_id) {
  return SettleJobIn(w, job_id);
}

absl::Status JobCore::RefuseReport(const v1::Task& task, const ReportKey& key,
                                   absl::Status refusal) {
  std::optional<v1::Job> settled;
  absl::Status s = reports_.Refuse(task, key, std::move(refusal), &settled);
  if (settled.has_value()) {
    MUTWO_LOG(warn, "task {} failed: report refused: {}", task.task_id(),
              s.ToString());
    AfterSettle(*settled);
    NotifyChange();
  }
  return s;
}

void JobCore::FinishReport(const v1::Job& job,
                           const std::vector<CachePut>& cache_puts) {
  ApplyCachePuts(cache_puts);
  AfterSettle(job);
  PublishModelMetrics(job);
  NotifyChange();
}

void JobCore::AfterSettle(const v1::Job& job, bool refresh_gauges) {
  if (refresh_gauges) RefreshGauges();
  if (IsFinal(job.state())) {
    MUTWO_LOG(info, "job {} {}{}", job.job_id(),
              v1::Job::State_Name(job.state()),
              job.error().empty() ? "" : absl::StrCat(": ", job.error()));
  }
}

void JobCore::PublishModelMetrics(const v1::Job& job) {
  metrics_->PublishJobResults(job);
}

}  // namespace mutwo
