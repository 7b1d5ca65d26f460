#include "server/job_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "planner/plan_request.h"
#include "planner/proto_convert.h"
#include "server/device_wait.h"
#include "server/max_batch_check.h"
#include "server/training_loop.h"

namespace mutwo {
namespace {

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

double ElapsedSeconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status ValidateBudget(const v1::MemoryBudget& b) {
  switch (b.kind_case()) {
    case v1::MemoryBudget::kBytes:
      if (b.bytes() > 0) return absl::OkStatus();
      break;
    case v1::MemoryBudget::kFractionOfBaseline:
      if (b.fraction_of_baseline() > 0 && b.fraction_of_baseline() <= 1) {
        return absl::OkStatus();
      }
      break;
    case v1::MemoryBudget::kFractionOfDevice:
      if (b.fraction_of_device() > 0 && b.fraction_of_device() <= 1) {
        return absl::OkStatus();
      }
      break;
    case v1::MemoryBudget::kKnee:
      if (b.knee()) return absl::OkStatus();
      break;
    case v1::MemoryBudget::kFloor:
      if (b.floor()) return absl::OkStatus();
      break;
    case v1::MemoryBudget::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "a budget has no kind: set bytes, fraction_of_baseline, "
          "fraction_of_device, knee or floor");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("budget \"", FormatBudget(b),
                   "\": bytes must be positive, fractions in (0, 1] and "
                   "knee or floor true"));
}

absl::Status ValidateSpec(const v1::JobSpec& spec) {
  std::vector<v1::TensorSpec> inputs(spec.inputs().begin(),
                                     spec.inputs().end());
  MUTWO_RETURN_IF_ERROR(ValidateInputs(inputs));
  if (spec.batch_sizes().empty()) {
    return absl::InvalidArgumentError("no batch sizes: give at least one");
  }
  if (spec.batch_sizes_size() > 64) {
    return absl::InvalidArgumentError("at most 64 batch sizes per job");
  }
  for (int64_t b : spec.batch_sizes()) {
    if (b <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch size ", b, " must be positive"));
    }
  }
  if (spec.budgets_size() > 32) {
    return absl::InvalidArgumentError("at most 32 budgets per job");
  }
  for (const auto& b : spec.budgets()) MUTWO_RETURN_IF_ERROR(ValidateBudget(b));
  if (spec.loss().kind() == v1::LossSpec::CROSS_ENTROPY) {
    if (spec.loss().target().name().empty()) {
      return absl::InvalidArgumentError(
          "loss cross_entropy needs a target spec, like y:int64[B]{0,1000}");
    }
    MUTWO_RETURN_IF_ERROR(ValidateInputs({spec.loss().target()}));
  }
  if (spec.has_capacity()) {
    const v1::MemoryBudget& c = spec.capacity();
    if (c.kind_case() != v1::MemoryBudget::kBytes &&
        c.kind_case() != v1::MemoryBudget::kFractionOfDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capacity \"", FormatBudget(c),
          "\": give bytes (80GiB) or a fraction of the device (95%dev)"));
    }
    MUTWO_RETURN_IF_ERROR(ValidateBudget(c));
  }
  if (spec.max_overhead() < 0 || spec.max_overhead() > 10) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_overhead ", spec.max_overhead(), " must be in [0, 10]"));
  }
  if (!spec.device_kind().empty() && spec.device_kind() != "cpu" &&
      spec.device_kind() != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_kind \"", spec.device_kind(), "\": use cpu, cuda or empty"));
  }
  return absl::OkStatus();
}

v1::BatchResult* FindOrAddResult(v1::Job& job, int64_t batch_size) {
  for (auto& r : *job.mutable_results()) {
    if (r.batch_size() == batch_size) return &r;
  }
  auto* r = job.add_results();
  r->set_batch_size(batch_size);
  // Keep results ordered by batch size.
  std::sort(job.mutable_results()->begin(), job.mutable_results()->end(),
            [](const v1::BatchResult& a, const v1::BatchResult& b) {
              return a.batch_size() < b.batch_size();
            });
  for (auto& res : *job.mutable_results()) {
    if (res.batch_size() == batch_size) return &res;
  }
  return r;
}

// The capacity the max batch size is predicted for; 0: the predictor's
// default (95% of the device).
int64_t CapacityBytes(const v1::JobSpec& spec, const v1::DeviceInfo& device) {
  if (spec.capacity().kind_case() == v1::MemoryBudget::kBytes) {
    return spec.capacity().bytes();
  }
  if (spec.capacity().kind_case() == v1::MemoryBudget::kFractionOfDevice) {
    return static_cast<int64_t>(spec.capacity().fraction_of_device() *
                                static_cast<double>(device.total_bytes()));
  }
  return 0;
}

// The schedule a MAX_BATCH task runs at `batch_size`: planned for the
// capacity from the profiles fitted to that batch size, below it by the
// margin the prediction kept for fragmentation (`margin_bytes`, on top of
// the allocator reserve), as the answer was; policy NONE for the answer
// without checkpointing.
absl::StatusOr<v1::Schedule> MaxBatchSchedule(
    const std::vector<v1::Profile>& profiles, int64_t batch_size,
    int64_t capacity_bytes, v1::Policy policy, int64_t margin_bytes) {
  planner::ScheduleRequest request;
  request.correction_bytes = policy == v1::NONE ? 0 : margin_bytes;
  request.budget.set_bytes(capacity_bytes);
  request.budget.set_text(
      absl::StrCat("max batch capacity ", FormatBytes(capacity_bytes)));
  request.policy = policy;
  request.max_timeline_samples = 0;
  return planner::PlanScheduleAtBatch(profiles, batch_size, request);
}

// What the prediction planned below the capacity and its reserve for the
// fragmentation the profiles measured (max_batch.h: the largest predicted
// peak is (capacity - reserve) / (1 + fraction)).
int64_t FragmentationMarginBytes(const v1::MaxBatchPrediction& m) {
  const int64_t usable = m.capacity_bytes() - m.reserve_bytes();
  if (usable <= 0 || m.fragmentation_fraction() <= 0) return 0;
  return usable -
         static_cast<int64_t>(std::floor(static_cast<double>(usable) /
                                         (1 + m.fragmentation_fraction())));
}

// Sets the checks of a fresh prediction and returns the MAX_BATCH tasks'
// schedules: one step at each answer (one when both answers are the same
// batch size: the unmodified step proves both), or why it is not run.
std::vector<v1::Schedule> PrepareMaxBatchChecks(
    const v1::JobSpec& spec, const std::vector<v1::Profile>& profiles,
    v1::MaxBatchPrediction& m) {
  const int64_t capacity = m.capacity_bytes();
  const std::string why = WhyNotVerified(spec, profiles.front().device());
  const int64_t margin = FragmentationMarginBytes(m);
  std::vector<v1::Schedule> out;
  auto prepare = [&](int64_t batch, v1::Policy policy, v1::MaxBatchCheck* c) {
    if (batch <= 0) {
      *c = UnverifiedCheck(batch, capacity,
                           "nothing to run: not even batch size 1 is "
                           "predicted to fit");
      return;
    }
    if (!why.empty()) {
      *c = UnverifiedCheck(batch, capacity, why);
      return;
    }
    auto schedule = MaxBatchSchedule(profiles, batch, capacity, policy, margin);
    if (!schedule.ok() || (policy != v1::NONE && !schedule->feasible())) {
      *c = UnverifiedCheck(
          batch, capacity,
          absl::StrCat("planning batch ", batch, " for the capacity: ",
                       schedule.ok() ? schedule->reason()
                                     : schedule.status().message()));
      return;
    }
    *c = QueuedCheck(batch, capacity);
    out.push_back(*std::move(schedule));
  };
  prepare(m.max_batch_without_checkpointing(), v1::NONE,
          m.mutable_without_checkpointing_check());
  if (m.max_batch_with_schedule() != m.max_batch_without_checkpointing()) {
    prepare(m.max_batch_with_schedule(), v1::MUTWO,
            m.mutable_with_schedule_check());
  }
  return out;
}

// Whether a PROFILE task of the job other than `task` is still to report.
bool OtherProfilePending(const std::vector<v1::Task>& tasks,
                         const v1::Task& task) {
  return std::any_of(tasks.begin(), tasks.end(), [&](const v1::Task& t) {
    return t.kind() == v1::Task::PROFILE && t.task_id() != task.task_id() &&
           (t.state() == v1::Task::QUEUED || t.state() == v1::Task::LEASED);
  });
}

// A prediction from a report that is not the job's last profile: its
// checks wait for the prediction over every profile.
void DeferMaxBatchChecks(v1::MaxBatchPrediction& m) {
  for (v1::MaxBatchCheck* c : {m.mutable_without_checkpointing_check(),
                               m.mutable_with_schedule_check()}) {
    if (c->state() == v1::MaxBatchCheck::VERIFYING) {
      c->set_state(v1::MaxBatchCheck::NOT_VERIFIED);
      c->set_reason("run once every batch size is profiled");
    }
  }
}

}  // namespace

PlanFn PlannerPlanFn(int pareto_points) {
  return
      [pareto_points](const v1::Profile& profile, const PlanRequest& request) {
        planner::ScheduleRequest r;
        r.budget = request.budget;
        r.policy = request.policy;
        r.pareto_points = request.include_pareto ? pareto_points : 0;
        r.correction_bytes = request.correction_bytes;
        r.interrupt = request.interrupt;
        return planner::PlanSchedule(profile, r);
      };
}

MaxBatchFn PlannerMaxBatchFn() {
  return [](const std::vector<v1::Profile>& profiles, int64_t capacity_bytes,
            double max_overhead) {
    return planner::PredictMaxBatchProto(profiles, capacity_bytes,
                                         max_overhead);
  };
}

// ---------------------------------------------------------------------------
// UploadSession

UploadSession::UploadSession(int64_t max_model_bytes, OpenFile open_file,
                             std::function<absl::Status(int64_t)> admit,
                             std::function<void()> done)
    : max_model_bytes_(max_model_bytes),
      open_file_(std::move(open_file)),
      admit_(std::move(admit)),
      done_(std::move(done)) {}

UploadSession::~UploadSession() {
  if (done_) done_();
}

absl::Status UploadSession::Header(const v1::UploadModelHeader& header) {
  if (has_header_) {
    return absl::InvalidArgumentError("upload: a second header was sent");
  }
  if (!IsSha256Hex(header.sha256())) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload: sha256 \"", header.sha256().substr(0, 80),
                     "\" is not 64 lowercase hex digits"));
  }
  if (header.size_bytes() <= 0) {
    return absl::InvalidArgumentError(
        "upload: declared size_bytes must be positive");
  }
  if (header.size_bytes() > max_model_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("upload: model of ", header.size_bytes(),
                     " bytes is over the limit of ", max_model_bytes_,
                     " bytes (--max_model_bytes)"));
  }
  if (admit_) {
    MUTWO_RETURN_IF_ERROR(admit_(header.size_bytes()));
  }
  if (open_file_) {
    MUTWO_ASSIGN_OR_RETURN(file_, open_file_());
  }
  header_ = header;
  has_header_ = true;
  return absl::OkStatus();
}

absl::Status UploadSession::Chunk(const std::string& bytes) {
  if (!has_header_) {
    return absl::InvalidArgumentError(
        "upload: the first message must carry the header");
  }
  if (static_cast<int64_t>(bytes.size()) > JobCore::kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload: chunk of ", bytes.size(), " bytes is over the 1 MiB limit"));
  }
  const int64_t total = received_ + static_cast<int64_t>(bytes.size());
  if (total > header_.size_bytes()) {
    const std::string msg =
        absl::StrCat("upload: received more than the declared ",
                     header_.size_bytes(), " bytes");
    return total > max_model_bytes_ ? absl::ResourceExhaustedError(msg)
                                    : absl::InvalidArgumentError(msg);
  }
  sha_.Update(bytes);
  if (file_ != nullptr) {
    MUTWO_RETURN_IF_ERROR(file_->Append(bytes));
  }
  received_ = total;
  return absl::OkStatus();
}

absl::Status UploadSession::Finish() {
  if (!has_header_) return absl::InvalidArgumentError("upload: no header sent");
  if (received_ != header_.size_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload: declared ", header_.size_bytes(),
                     " bytes but received ", received_));
  }
  const std::string got = sha_.HexDigest();
  if (got != header_.sha256()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload: declared sha256 ", header_.sha256(),
                     " but the bytes hash to ", got));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// JobCore

JobCore::JobCore(Options options, storage::Store* store, ServerMetrics* metrics,
                 PlanFn plan, MaxBatchFn max_batch)
    : options_(options),
      loop_options_{options.max_validation_rounds,
                    options.replan_margin_fraction},
      store_(store),
      metrics_(metrics),
      plan_(std::move(plan)),
      max_batch_(std::move(max_batch)),
      cache_(store, metrics) {}

absl::StatusOr<std::unique_ptr<JobCore>> JobCore::Create(Options options,
                                                         storage::Store* store,
                                                         ServerMetrics* metrics,
                                                         PlanFn plan,
                                                         MaxBatchFn max_batch) {
  if (store == nullptr || metrics == nullptr || !plan || !max_batch) {
    return absl::InvalidArgumentError(
        "JobCore needs a store, metrics and a planner");
  }
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
  if (options.profile_limits.max_nodes < 1 ||
      options.profile_limits.max_edges < 1) {
    return absl::InvalidArgumentError(
        "--max_profile_nodes and --max_profile_edges must be positive");
  }
  if (options.worker_lost_after_ms <= 0) {
    options.worker_lost_after_ms = 3 * options.lease_timeout_ms;
  }
  std::unique_ptr<JobCore> core(new JobCore(
      options, store, metrics, std::move(plan), std::move(max_batch)));
  Leasing::Options lease_options;
  lease_options.lease_timeout_ms = options.lease_timeout_ms;
  lease_options.max_attempts = options.max_attempts;
  lease_options.worker_lost_after_ms = options.worker_lost_after_ms;
  lease_options.worker_forget_after_ms = options.worker_forget_after_ms;
  lease_options.reaper_interval_ms = options.reaper_interval_ms;
  lease_options.max_lease_wait_ms = options.max_lease_wait_ms;
  lease_options.max_lease_waiters = options.max_lease_waiters;
  lease_options.waiter_retry_after_ms = options.waiter_retry_after_ms;
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
  MUTWO_ASSIGN_OR_RETURN(core->leasing_,
                         Leasing::Create(lease_options, store, hooks));
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
  MUTWO_ASSIGN_OR_RETURN(core->watchers_, WaiterSet::Create(watch_options));
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
  const int64_t max_bytes = options_.max_upload_bytes_per_client > 0
                                ? options_.max_upload_bytes_per_client
                                : 2 * options_.max_model_bytes;
  {
    absl::MutexLock lock(&uploads_mu_);
    ClientUploads& mine = uploads_[principal];
    if (mine.running >= options_.max_uploads_per_client) {
      return absl::ResourceExhaustedError(
          absl::StrCat("upload: ", mine.running,
                       " uploads of this client are running, "
                       "the limit is ",
                       options_.max_uploads_per_client,
                       " (--max_uploads_per_client); retry when one ended"));
    }
    ++mine.running;
  }
  auto admitted = std::make_shared<int64_t>(0);
  return std::make_unique<UploadSession>(
      options_.max_model_bytes, [this] { return store_->NewModelFile(); },
      [this, principal, max_bytes, admitted](int64_t declared) {
        absl::MutexLock lock(&uploads_mu_);
        ClientUploads& mine = uploads_[principal];
        if (mine.declared_bytes + declared > max_bytes) {
          return absl::ResourceExhaustedError(
              absl::StrCat("upload: this client's running uploads declare ",
                           mine.declared_bytes, " bytes; ", declared,
                           " more would pass the limit of ", max_bytes,
                           " bytes (--max_upload_bytes_per_client)"));
        }
        mine.declared_bytes += declared;
        *admitted = declared;
        return absl::OkStatus();
      },
      [this, principal, admitted] {
        absl::MutexLock lock(&uploads_mu_);
        auto it = uploads_.find(principal);
        if (it == uploads_.end()) return;
        it->second.declared_bytes -= *admitted;
        if (--it->second.running <= 0) uploads_.erase(it);
      });
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

absl::StatusOr<v1::Schedule> JobCore::Plan(
    const v1::Profile& profile, const v1::MemoryBudget& budget,
    v1::Policy policy, int64_t correction_bytes,
    const std::function<bool()>& cancelled) {
  if (profile.oom()) {
    return absl::FailedPreconditionError(
        absl::StrCat("batch size ", profile.batch_size(),
                     " ran out of memory while profiling (", profile.oom_step(),
                     "); no schedule can be planned from it"));
  }
  PlanRequest request;
  request.budget = budget;
  request.policy = policy;
  // Cached schedules always carry the Pareto curve so that one entry serves
  // requests with and without it.
  request.include_pareto = true;
  request.correction_bytes = correction_bytes;
  planner::Interrupt interrupt(
      absl::Now() + absl::Milliseconds(options_.max_plan_ms), cancelled);
  request.interrupt = &interrupt;
  const auto start = std::chrono::steady_clock::now();
  auto schedule = plan_(profile, request);
  metrics_->ObservePlanner(ElapsedSeconds(start));
  return schedule;
}

absl::StatusOr<v1::Schedule> JobCore::PlanCached(
    const v1::JobSpec& spec, const std::string& job_id,
    const std::string& tenant, int64_t batch_size, const v1::DeviceInfo& device,
    const std::function<absl::StatusOr<v1::Profile>()>& load_profile,
    const v1::MemoryBudget& budget, v1::Policy policy, bool include_pareto,
    bool include_timeline, std::vector<CachePut>* deferred,
    const std::function<bool()>& cancelled) {
  const storage::ScheduleCacheKey key = storage::MakeScheduleCacheKey(
      spec, batch_size, device, budget, policy, tenant);
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> cached,
                         cache_.Get(key, include_pareto, include_timeline));
  if (cached.has_value()) return *std::move(cached);
  // Only a miss needs the whole profile.
  MUTWO_ASSIGN_OR_RETURN(v1::Profile profile, load_profile());
  MUTWO_ASSIGN_OR_RETURN(
      v1::Schedule schedule,
      Plan(profile, budget, policy, /*correction_bytes=*/0, cancelled));
  if (deferred != nullptr) {
    deferred->push_back(CachePut{key, job_id, schedule});
  } else {
    MUTWO_RETURN_IF_ERROR(cache_.Put(key, job_id, schedule));
  }
  return ScheduleCache::Trim(std::move(schedule), include_pareto,
                             include_timeline);
}

absl::StatusOr<std::shared_ptr<const v1::Job>> JobCore::JobFactsOf(
    const std::string& job_id) {
  {
    absl::MutexLock lock(&hot_mu_);
    auto it = hot_jobs_.find(job_id);
    if (it != hot_jobs_.end()) return it->second;
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(job_id));
  // A job's spec and owner never change after SubmitJob, so they can be
  // kept.
  auto facts = std::make_shared<v1::Job>();
  *facts->mutable_spec() = job.spec();
  facts->set_owner(job.owner());
  absl::MutexLock lock(&hot_mu_);
  if (hot_jobs_.size() >= kHotCacheEntries) hot_jobs_.clear();
  hot_jobs_[job_id] = facts;
  return facts;
}

absl::StatusOr<std::shared_ptr<const v1::DeviceInfo>> JobCore::ProfileDeviceOf(
    const std::string& job_id, int64_t batch_size) {
  const std::string key = absl::StrCat(job_id, "/", batch_size);
  {
    absl::MutexLock lock(&hot_mu_);
    auto it = hot_devices_.find(key);
    if (it != hot_devices_.end()) return it->second;
  }
  auto device = store_->GetProfileDevice(job_id, batch_size);
  if (absl::IsNotFound(device.status())) {
    return absl::NotFoundError(absl::StrCat("job ", job_id,
                                            " has no profile for batch size ",
                                            batch_size, " (yet)"));
  }
  MUTWO_RETURN_IF_ERROR(device.status());
  // Only one profile is ever stored per (job, batch): the first completed
  // report wins (fencing), so its device can be kept.
  auto shared = std::make_shared<const v1::DeviceInfo>(*std::move(device));
  absl::MutexLock lock(&hot_mu_);
  if (hot_devices_.size() >= kHotCacheEntries) hot_devices_.clear();
  hot_devices_[key] = shared;
  return shared;
}

absl::StatusOr<v1::Schedule> JobCore::GetSchedule(
    const v1::GetScheduleRequest& request, std::function<bool()> cancelled) {
  if (request.budget().kind_case() == v1::MemoryBudget::KIND_NOT_SET) {
    return absl::InvalidArgumentError(
        "GetSchedule needs a budget (bytes, fraction of baseline or device)");
  }
  MUTWO_RETURN_IF_ERROR(ValidateBudget(request.budget()));
  MUTWO_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Job> job,
                         JobFactsOf(request.job_id()));
  MUTWO_ASSIGN_OR_RETURN(
      std::shared_ptr<const v1::DeviceInfo> device,
      ProfileDeviceOf(request.job_id(), request.batch_size()));
  const v1::Policy policy =
      request.policy() == v1::POLICY_UNSPECIFIED ? v1::MUTWO : request.policy();
  return PlanCached(
      job->spec(), request.job_id(), job->owner(), request.batch_size(),
      *device,
      [&] {
        return store_->GetProfile(request.job_id(), request.batch_size());
      },
      request.budget(), policy, request.include_pareto(),
      request.include_timeline(), /*deferred=*/nullptr, cancelled);
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

namespace {

// Whether a report for `task` with this fence from this worker can be
// taken now (the lease it holds, or one that expired with nobody leasing
// the task since), so that planning for it is worth doing.
bool MayComplete(const v1::Task& task, int64_t fence_token,
                 const std::string& worker_id) {
  return task.fence_token() == fence_token && task.lease_owner() == worker_id &&
         (task.state() == v1::Task::LEASED || task.state() == v1::Task::QUEUED);
}

bool IsRetriedReport(const v1::Task& task, int64_t fence_token,
                     const std::string& worker_id) {
  return task.state() == v1::Task::DONE && task.fence_token() == fence_token &&
         task.lease_owner() == worker_id;
}

}  // namespace

absl::Status JobCore::RefuseReport(const std::string& task_id,
                                   int64_t fence_token,
                                   const std::string& worker_id) {
  // The store names what is wrong (stale fence, not leased, another
  // worker's lease); nothing is written either way.
  return store_->Write([&](storage::Store::Writer& w) -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(bool stored,
                           w.CompleteTask(task_id, fence_token, worker_id, ""));
    if (stored) {
      return absl::AbortedError(absl::StrCat(
          "task ", task_id, " changed while its report was read; retry"));
    }
    return absl::OkStatus();  // a retried report of a completed task
  });
}

absl::Status JobCore::WriteReport(
    absl::string_view task_id, int64_t fence_token, absl::string_view worker_id,
    absl::string_view result, bool* retried,
    const std::function<absl::Status(storage::Store::Writer&)>& body) {
  return store_->Write([&](storage::Store::Writer& w) -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(bool stored_now, w.CompleteTask(task_id, fence_token,
                                                           worker_id, result));
    if (!stored_now) {
      *retried = true;
      return absl::OkStatus();
    }
    return body(w);
  });
}

void JobCore::ApplyCachePuts(const std::vector<CachePut>& puts) {
  for (const CachePut& put : puts) {
    if (absl::Status s = cache_.Put(put.key, put.job_id, put.schedule);
        !s.ok()) {
      // The cache is derived data: a later request plans again.
      MUTWO_LOG(warn, "schedule cache: {}", s.ToString());
    }
  }
}

absl::Status JobCore::AnswerMemory(const v1::Job& job, int64_t batch_size,
                                   const v1::Profile& profile,
                                   v1::BatchResult& result,
                                   std::vector<CachePut>* cache_puts) {
  v1::MemoryBudget knee;
  knee.set_knee(true);
  knee.set_text("auto");
  MUTWO_ASSIGN_OR_RETURN(
      v1::Schedule at_knee,
      PlanCached(
          job.spec(), job.job_id(), job.owner(), batch_size, profile.device(),
          [&]() -> absl::StatusOr<v1::Profile> { return profile; }, knee,
          v1::MUTWO, /*include_pareto=*/true, /*include_timeline=*/false,
          cache_puts));
  result.set_floor_bytes(at_knee.floor_bytes());
  result.set_plan_baseline_iteration_ms(at_knee.baseline_iteration_ms());
  *result.mutable_pareto() = at_knee.pareto();
  v1::ParetoPoint& k = *result.mutable_knee();
  k.set_budget_bytes(at_knee.budget_bytes());
  k.set_predicted_peak_bytes(at_knee.predicted_peak_bytes());
  k.set_predicted_iteration_ms(at_knee.predicted_iteration_ms());
  k.set_recomputed(at_knee.recomputed());
  k.set_swapped(at_knee.swapped());
  return absl::OkStatus();
}

absl::Status JobCore::ReportProfile(const v1::ReportProfileRequest& request) {
  MUTWO_ASSIGN_OR_RETURN(v1::Task task, store_->GetTask(request.task_id()));
  if (task.kind() != v1::Task::PROFILE) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", task.task_id(), " is not a PROFILE task"));
  }
  const v1::Profile& profile = request.profile();
  if (profile.batch_size() != task.batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile is for batch size ", profile.batch_size(), " but task ",
        task.task_id(), " is for ", task.batch_size()));
  }
  // Refused before anything is stored or planned: larger than this server
  // plans, or what the planner would refuse later, named by field.
  std::string limit;
  if (absl::Status s =
          CheckProfileSize(profile, options_.profile_limits, &limit);
      !s.ok()) {
    metrics_->CountLimitRefusal(limit);
    return s;
  }
  MUTWO_RETURN_IF_ERROR(planner::ValidateProfile(profile));
  if (IsRetriedReport(task, request.fence_token(), request.worker_id())) {
    return absl::OkStatus();
  }
  if (!MayComplete(task, request.fence_token(), request.worker_id())) {
    return RefuseReport(request.task_id(), request.fence_token(),
                        request.worker_id());
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task.job_id()));
  // PLANNING while this batch size is planned, once no other profile is
  // pending (else the job stays PROFILING). A state shown, not a fact: the
  // report below settles the job again.
  MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> job_tasks,
                         store_->ListTasks(task.job_id()));
  const bool others_pending =
      std::any_of(job_tasks.begin(), job_tasks.end(), [&](const v1::Task& t) {
        return t.kind() == v1::Task::PROFILE && t.task_id() != task.task_id() &&
               (t.state() == v1::Task::QUEUED || t.state() == v1::Task::LEASED);
      });
  if (!IsFinal(job.state()) && !others_pending &&
      job.state() != v1::Job::PLANNING) {
    auto planning = store_->UpdateJob(task.job_id(), [&](v1::Job& j) {
      if (!IsFinal(j.state())) j.set_state(v1::Job::PLANNING);
      return absl::OkStatus();
    });
    if (planning.ok()) NotifyChange();
  }

  // Everything that takes time (planning, the max batch prediction) is done
  // before the transaction; the transaction stores it all or nothing.
  v1::BatchResult result;
  std::vector<v1::Schedule> to_validate;
  std::vector<CachePut> cache_puts;
  result.set_batch_size(task.batch_size());
  result.set_baseline_peak_bytes(profile.measured().peak_bytes());
  // The step time the schedules' predicted times are scaled to.
  result.set_baseline_iteration_ms(profile.measured().iteration_ms() *
                                   planner::TimeScale(profile.measured()));
  if (profile.oom()) {
    result.set_oom(true);
    result.set_error(
        absl::StrCat("out of memory while profiling at ", profile.oom_step()));
  } else if (!IsFinal(job.state())) {
    // The memory question first, whether or not budgets were given.
    if (absl::Status s =
            AnswerMemory(job, task.batch_size(), profile, result, &cache_puts);
        !s.ok()) {
      result.set_error(absl::StrCat("floor and Pareto curve: ", s.message()));
    }
    for (const v1::MemoryBudget& budget : job.spec().budgets()) {
      auto schedule = PlanCached(
          job.spec(), job.job_id(), job.owner(), task.batch_size(),
          profile.device(),
          [&]() -> absl::StatusOr<v1::Profile> { return profile; }, budget,
          v1::MUTWO, /*include_pareto=*/false, /*include_timeline=*/false,
          &cache_puts);
      if (!schedule.ok()) {
        result.set_error(absl::StrCat("planning for budget ",
                                      FormatBudget(budget), ": ",
                                      schedule.status().message()));
        break;
      }
      // Feasible is a prediction: only a validation round makes it fit.
      *result.add_outcomes() = PlannedOutcome(*schedule);
      if (schedule->feasible()) to_validate.push_back(*schedule);
      *result.add_schedules() = *std::move(schedule);
    }
  }

  // Max batch size from every usable profile of the job with this one. The
  // profiles used are checked again inside the transaction: a profile
  // another report stored meanwhile means predicting again.
  bool retried = false;
  constexpr int kMaxPredictions = 4;
  for (int prediction_round = 1;; ++prediction_round) {
    std::vector<v1::Profile> profiles;
    std::vector<int64_t> used;  // batch sizes of the other DONE profiles
    MUTWO_ASSIGN_OR_RETURN(job_tasks, store_->ListTasks(task.job_id()));
    for (const v1::Task& t : job_tasks) {
      if (t.kind() != v1::Task::PROFILE || t.state() != v1::Task::DONE ||
          t.task_id() == task.task_id()) {
        continue;
      }
      used.push_back(t.batch_size());
      auto p = store_->GetProfile(task.job_id(), t.batch_size());
      if (p.ok() && !p->oom()) profiles.push_back(*std::move(p));
    }
    if (!profile.oom()) profiles.push_back(profile);
    std::optional<v1::MaxBatchPrediction> max_batch;
    // MAX_BATCH tasks to queue when this report is the last profile.
    std::vector<v1::Schedule> to_verify;
    if (profiles.size() >= 2) {
      const double overhead =
          job.spec().max_overhead() > 0 ? job.spec().max_overhead() : 0.25;
      auto prediction = max_batch_(
          profiles, CapacityBytes(job.spec(), profile.device()), overhead);
      if (prediction.ok()) {
        max_batch = *std::move(prediction);
        to_verify = PrepareMaxBatchChecks(job.spec(), profiles, *max_batch);
      } else {
        MUTWO_LOG(warn, "job {}: max batch: {}", job.job_id(),
                  prediction.status().ToString());
      }
    }
    absl::Status written = WriteReport(
        request.task_id(), request.fence_token(), request.worker_id(),
        profile.SerializeAsString(), &retried,
        [&](storage::Store::Writer& w) -> absl::Status {
          MUTWO_RETURN_IF_ERROR(
              w.PutProfile(task.job_id(), task.batch_size(), profile));
          MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> now_tasks,
                                 w.ListTasks(task.job_id()));
          std::vector<int64_t> done;
          for (const v1::Task& t : now_tasks) {
            if (t.kind() == v1::Task::PROFILE && t.state() == v1::Task::DONE &&
                t.task_id() != task.task_id()) {
              done.push_back(t.batch_size());
            }
          }
          if (done != used && prediction_round < kMaxPredictions) {
            return absl::AbortedError("another profile was stored meanwhile");
          }
          // The max batch is verified once, from the prediction over every
          // profile: by the report of the last one.
          if (max_batch.has_value() && OtherProfilePending(now_tasks, task)) {
            DeferMaxBatchChecks(*max_batch);
            to_verify.clear();
          }
          bool final = false;
          MUTWO_RETURN_IF_ERROR(w.UpdateJob(task.job_id(), [&](v1::Job& j) {
                                   final = IsFinal(j.state());
                                   *FindOrAddResult(j, task.batch_size()) =
                                       result;
                                   if (max_batch.has_value())
                                     *j.mutable_max_batch() = *max_batch;
                                   return absl::OkStatus();
                                 }).status());
          if (!final) {
            for (const v1::Schedule& schedule : to_validate) {
              MUTWO_RETURN_IF_ERROR(w.AddTask(task.job_id(), v1::Task::VALIDATE,
                                              task.batch_size(), schedule)
                                        .status());
            }
            for (const v1::Schedule& schedule : to_verify) {
              MUTWO_RETURN_IF_ERROR(w.AddTask(task.job_id(),
                                              v1::Task::MAX_BATCH,
                                              schedule.batch_size(), schedule)
                                        .status());
            }
          }
          MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
          return absl::OkStatus();
        });
    if (absl::IsAborted(written)) continue;
    MUTWO_RETURN_IF_ERROR(written);
    break;
  }
  if (retried) return absl::OkStatus();
  ApplyCachePuts(cache_puts);
  AfterSettle(job);
  PublishModelMetrics(job);
  NotifyChange();
  return absl::OkStatus();
}

absl::Status JobCore::ReportValidation(
    const v1::ReportValidationRequest& request) {
  MUTWO_ASSIGN_OR_RETURN(v1::Task task, store_->GetTask(request.task_id()));
  if (task.kind() == v1::Task::MAX_BATCH) {
    return ReportMaxBatchStep(request, task);
  }
  if (task.kind() != v1::Task::VALIDATE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", task.task_id(), " is not a VALIDATE or MAX_BATCH task"));
  }
  if (IsRetriedReport(task, request.fence_token(), request.worker_id())) {
    return absl::OkStatus();
  }
  if (!MayComplete(task, request.fence_token(), request.worker_id())) {
    return RefuseReport(request.task_id(), request.fence_token(),
                        request.worker_id());
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task.job_id()));
  const v1::MemoryBudget& budget = task.schedule().budget();
  // The outcome so far; a job of an older server has none yet.
  v1::BudgetOutcome outcome = PlannedOutcome(task.schedule());
  if (const v1::BudgetOutcome* known =
          FindOutcome(*FindOrAddResult(job, task.batch_size()), budget)) {
    outcome = *known;
  }
  const int round = outcome.rounds() + 1;
  v1::Validation validation = request.validation();
  validation.set_round(round);
  std::vector<CachePut> cache_puts;
  MUTWO_ASSIGN_OR_RETURN(RoundResult next,
                         CloseRound(job, task, validation, round,
                                    std::move(outcome), &cache_puts));
  bool retried = false;
  MUTWO_RETURN_IF_ERROR(WriteReport(
      request.task_id(), request.fence_token(), request.worker_id(),
      request.validation().SerializeAsString(), &retried,
      [&](storage::Store::Writer& w) -> absl::Status {
        MUTWO_RETURN_IF_ERROR(w.PutValidation(
            task.job_id(), task.batch_size(),
            budget.text().empty() ? FormatBudget(budget) : budget.text(), round,
            validation));
        bool final = false;
        MUTWO_RETURN_IF_ERROR(
            w.UpdateJob(task.job_id(), [&](v1::Job& j) {
               final = IsFinal(j.state());
               v1::BatchResult& r = *FindOrAddResult(j, task.batch_size());
               *r.add_validations() = validation;
               bool shown = false;
               for (v1::Schedule& s : *r.mutable_schedules()) {
                 if (s.budget().SerializeAsString() ==
                     budget.SerializeAsString()) {
                   s = next.schedule;
                   shown = true;
                 }
               }
               if (!shown) *r.add_schedules() = next.schedule;
               if (v1::BudgetOutcome* o = FindOutcome(r, budget)) {
                 *o = next.outcome;
               } else {
                 *r.add_outcomes() = next.outcome;
               }
               if (budget.floor() &&
                   next.outcome.state() == v1::BudgetOutcome::FITS) {
                 r.set_measured_floor_bytes(next.outcome.budget_bytes());
               }
               return absl::OkStatus();
             }).status());
        if (next.next_round.has_value() && !final) {
          MUTWO_RETURN_IF_ERROR(w.AddTask(job.job_id(), v1::Task::VALIDATE,
                                          task.batch_size(), *next.next_round)
                                    .status());
        }
        MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
        return absl::OkStatus();
      }));
  if (retried) return absl::OkStatus();
  ApplyCachePuts(cache_puts);
  metrics_->CountValidation(next.metric_result);
  MUTWO_LOG(info, "job {} batch {} budget {}: round {} measured {}: {}{}",
            task.job_id(), task.batch_size(), FormatBudget(budget), round,
            FormatBytes(validation.scheduled().peak_bytes()),
            v1::BudgetOutcome::State_Name(next.outcome.state()),
            next.outcome.state() == v1::BudgetOutcome::VALIDATING
                ? absl::StrCat(" (round ", round + 1, " planned ",
                               FormatBytes(next.outcome.correction_bytes()),
                               " below the budget)")
            : next.outcome.reason().empty()
                ? ""
                : absl::StrCat(" (", next.outcome.reason(), ")"));
  AfterSettle(job);
  PublishModelMetrics(job);
  NotifyChange();
  return absl::OkStatus();
}

absl::Status JobCore::ReportMaxBatchStep(
    const v1::ReportValidationRequest& request, const v1::Task& task) {
  if (IsRetriedReport(task, request.fence_token(), request.worker_id())) {
    return absl::OkStatus();
  }
  if (!MayComplete(task, request.fence_token(), request.worker_id())) {
    return RefuseReport(request.task_id(), request.fence_token(),
                        request.worker_id());
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task.job_id()));
  v1::MaxBatchPrediction prediction = job.max_batch();
  std::optional<MaxBatchStep> step;
  std::optional<v1::Schedule> next_step;
  if (const v1::MaxBatchCheck* check = CheckForTask(prediction, task)) {
    step =
        JudgeMaxBatchStep(*check, request.validation(), MaxBatchCheckOptions{});
    if (step->next == MaxBatchStep::Next::kStepDown) {
      // Planned again at the smaller batch size from every profile.
      std::vector<v1::Profile> profiles;
      MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> tasks,
                             store_->ListTasks(task.job_id()));
      for (const v1::Task& t : tasks) {
        if (t.kind() != v1::Task::PROFILE || t.state() != v1::Task::DONE) {
          continue;
        }
        auto p = store_->GetProfile(task.job_id(), t.batch_size());
        if (p.ok() && !p->oom()) profiles.push_back(*std::move(p));
      }
      auto schedule =
          profiles.size() >= 2
              ? MaxBatchSchedule(profiles, step->next_batch,
                                 step->check.capacity_bytes(),
                                 task.schedule().policy(),
                                 FragmentationMarginBytes(prediction))
              : absl::FailedPreconditionError("fewer than two profiles");
      if (schedule.ok()) {
        next_step = *std::move(schedule);
      } else {
        step->next = MaxBatchStep::Next::kFailed;
        step->check.set_state(v1::MaxBatchCheck::FAILED);
        step->check.set_reason(absl::StrCat(
            step->check.reason(), "; planning batch ", step->next_batch,
            " failed: ", schedule.status().message()));
      }
    }
  }
  bool retried = false;
  MUTWO_RETURN_IF_ERROR(WriteReport(
      request.task_id(), request.fence_token(), request.worker_id(),
      request.validation().SerializeAsString(), &retried,
      [&](storage::Store::Writer& w) -> absl::Status {
        bool final = false;
        MUTWO_RETURN_IF_ERROR(
            w.UpdateJob(task.job_id(), [&](v1::Job& j) {
               final = IsFinal(j.state());
               v1::MaxBatchPrediction& m = *j.mutable_max_batch();
               v1::MaxBatchCheck* c = CheckForTask(m, task);
               // A prediction replaced meanwhile has checks of its own.
               if (c == nullptr || !step.has_value()) return absl::OkStatus();
               *c = step->check;
               if (step->next == MaxBatchStep::Next::kVerified) {
                 // The reported answer is the verified one; one step
                 // without checkpointing answers both when they agreed.
                 if (c == m.mutable_without_checkpointing_check()) {
                   m.set_max_batch_without_checkpointing(c->batch_size());
                   if (!m.has_with_schedule_check()) {
                     m.set_max_batch_with_schedule(c->batch_size());
                   }
                 } else {
                   m.set_max_batch_with_schedule(c->batch_size());
                 }
               }
               return absl::OkStatus();
             }).status());
        if (next_step.has_value() && !final) {
          MUTWO_RETURN_IF_ERROR(w.AddTask(task.job_id(), v1::Task::MAX_BATCH,
                                          next_step->batch_size(), *next_step)
                                    .status());
        }
        MUTWO_ASSIGN_OR_RETURN(job, SettleIn(w, task.job_id()));
        return absl::OkStatus();
      }));
  if (retried) return absl::OkStatus();
  if (step.has_value()) {
    MUTWO_LOG(info, "job {} max batch {}: {}", task.job_id(),
              v1::MaxBatchCheck::State_Name(step->check.state()),
              step->check.reason());
  }
  AfterSettle(job);
  PublishModelMetrics(job);
  NotifyChange();
  return absl::OkStatus();
}

absl::StatusOr<JobCore::RoundResult> JobCore::CloseRound(
    const v1::Job& job, const v1::Task& task, const v1::Validation& validation,
    int round, v1::BudgetOutcome outcome, std::vector<CachePut>* cache_puts) {
  const v1::Schedule& ran = task.schedule();
  const RoundDecision decision =
      JudgeRound(ran, validation, round, loop_options_);
  const int64_t measured = validation.scheduled().peak_bytes();
  const bool measured_over = !validation.oom() && measured > ran.budget_bytes();
  outcome.set_rounds(round);
  outcome.set_measured_peak_bytes(validation.oom() ? 0 : measured);
  outcome.set_fits(false);
  outcome.clear_reason();
  RoundResult result;
  result.metric_result = decision.metric_result;
  std::string reason = decision.reason;
  switch (decision.next) {
    case RoundDecision::Next::kFits:
      outcome.set_state(v1::BudgetOutcome::FITS);
      outcome.set_fits(true);
      break;
    case RoundDecision::Next::kFailed:
      outcome.set_state(v1::BudgetOutcome::FAILED);
      break;
    case RoundDecision::Next::kOverBudget:
      outcome.set_state(v1::BudgetOutcome::OVER_BUDGET);
      break;
    case RoundDecision::Next::kFloorMeasured:
      // Proved at the peak measured (MarkMeasured raises the schedule's
      // budget to it below): the floor is what the step took.
      outcome.set_state(v1::BudgetOutcome::FITS);
      outcome.set_fits(true);
      outcome.set_budget_bytes(measured);
      break;
    case RoundDecision::Next::kReplan: {
      MUTWO_ASSIGN_OR_RETURN(
          v1::Profile profile,
          store_->GetProfile(job.job_id(), task.batch_size()));
      MUTWO_ASSIGN_OR_RETURN(
          v1::Schedule replanned,
          Plan(profile, ran.budget(), ran.policy(), decision.correction_bytes));
      if (replanned.feasible()) {
        // The corrected plan replaces the one that overshot, for this job's
        // next round and for every later job with the same key.
        cache_puts->push_back(CachePut{
            storage::MakeScheduleCacheKey(job.spec(), task.batch_size(),
                                          profile.device(), ran.budget(),
                                          ran.policy(), job.owner()),
            job.job_id(), replanned});
        result.schedule = ScheduleCache::Trim(std::move(replanned),
                                              /*include_pareto=*/false,
                                              /*include_timeline=*/false);
        result.next_round = result.schedule;
        outcome.set_state(v1::BudgetOutcome::VALIDATING);
        outcome.set_predicted_peak_bytes(
            result.schedule.predicted_peak_bytes());
        outcome.set_correction_bytes(result.schedule.correction_bytes());
        result.outcome = std::move(outcome);
        return result;
      }
      reason = NoRoomReason(replanned, measured, round);
      outcome.set_state(v1::BudgetOutcome::OVER_BUDGET);
      break;
    }
  }
  outcome.set_reason(reason);
  // Whatever else went wrong, a peak over the budget is a fact about the
  // plan that ran: the cache must not serve it as fitting again.
  if (decision.next == RoundDecision::Next::kFits ||
      decision.next == RoundDecision::Next::kFloorMeasured || measured_over) {
    MUTWO_RETURN_IF_ERROR(
        RecordMeasurement(job, task, measured, reason, cache_puts));
  }
  result.schedule =
      validation.oom() ? ran : MarkMeasured(ran, measured, reason);
  result.outcome = std::move(outcome);
  return result;
}

absl::Status JobCore::RecordMeasurement(const v1::Job& job,
                                        const v1::Task& task,
                                        int64_t measured_bytes,
                                        const std::string& reason,
                                        std::vector<CachePut>* cache_puts) {
  const v1::Schedule& ran = task.schedule();
  MUTWO_ASSIGN_OR_RETURN(std::shared_ptr<const v1::DeviceInfo> device,
                         ProfileDeviceOf(job.job_id(), task.batch_size()));
  const storage::ScheduleCacheKey key =
      storage::MakeScheduleCacheKey(job.spec(), task.batch_size(), *device,
                                    ran.budget(), ran.policy(), job.owner());
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Schedule> entry, cache_.Peek(key));
  if (entry.has_value() && !SamePlan(*entry, ran)) {
    return absl::OkStatus();  // re-planned or marked since this round began
  }
  cache_puts->push_back(
      CachePut{key, job.job_id(),
               MarkMeasured(entry.has_value() ? *std::move(entry) : ran,
                            measured_bytes, reason)});
  return absl::OkStatus();
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

void JobCore::AfterSettle(const v1::Job& job, bool refresh_gauges) {
  if (refresh_gauges) RefreshGauges();
  if (IsFinal(job.state())) {
    MUTWO_LOG(info, "job {} {}{}", job.job_id(),
              v1::Job::State_Name(job.state()),
              job.error().empty() ? "" : absl::StrCat(": ", job.error()));
  }
}

absl::StatusOr<v1::Job> JobCore::SettleIn(storage::Store::Writer& w,
                                          const std::string& job_id) {
  MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> tasks, w.ListTasks(job_id));
  int pending_profile = 0, pending_validate = 0, started = 0, finished = 0;
  int profiles_failed = 0, profiles_total = 0;
  std::string first_error;
  for (const v1::Task& t : tasks) {
    const bool pending =
        t.state() == v1::Task::QUEUED || t.state() == v1::Task::LEASED;
    if (t.kind() == v1::Task::PROFILE) {
      ++profiles_total;
      if (pending) ++pending_profile;
      if (t.state() == v1::Task::FAILED) ++profiles_failed;
    } else if (pending) {
      ++pending_validate;
    }
    if (!pending) ++finished;
    if (t.state() != v1::Task::QUEUED || t.attempt() > 1) ++started;
    // A max batch step that failed says so in its check; the job's results
    // stand.
    if (t.state() == v1::Task::FAILED && first_error.empty() &&
        t.kind() != v1::Task::MAX_BATCH) {
      first_error = absl::StrCat(v1::Task::Kind_Name(t.kind()), " batch ",
                                 t.batch_size(), ": ", t.last_error());
    }
  }
  return w.UpdateJob(job_id, [&](v1::Job& j) {
    j.set_tasks_total(static_cast<int32_t>(tasks.size()));
    j.set_tasks_done(finished);
    // A max batch step that will never report ends its check.
    for (const v1::Task& t : tasks) {
      if (t.kind() != v1::Task::MAX_BATCH ||
          (t.state() != v1::Task::FAILED && t.state() != v1::Task::CANCELLED)) {
        continue;
      }
      v1::MaxBatchCheck* c = CheckForTask(*j.mutable_max_batch(), t);
      if (c == nullptr) continue;
      c->set_state(v1::MaxBatchCheck::FAILED);
      c->set_reason(t.state() == v1::Task::FAILED
                        ? absl::StrCat("the step at batch ", t.batch_size(),
                                       " failed: ", t.last_error())
                        : "the job was cancelled before the step ran");
    }
    // A round that will never report ends its budget's loop.
    for (const v1::Task& t : tasks) {
      if (t.kind() != v1::Task::VALIDATE ||
          (t.state() != v1::Task::FAILED && t.state() != v1::Task::CANCELLED)) {
        continue;
      }
      v1::BudgetOutcome* o = FindOutcome(*FindOrAddResult(j, t.batch_size()),
                                         t.schedule().budget());
      if (o == nullptr || o->state() != v1::BudgetOutcome::VALIDATING) {
        continue;
      }
      o->set_state(v1::BudgetOutcome::FAILED);
      o->set_reason(t.state() == v1::Task::FAILED
                        ? absl::StrCat("validation round ", o->rounds() + 1,
                                       " failed: ", t.last_error())
                        : "the job was cancelled before the validation "
                          "ended");
    }
    if (IsFinal(j.state())) return absl::OkStatus();
    if (pending_profile > 0) {
      j.set_state(started > 0 ? v1::Job::PROFILING : v1::Job::QUEUED);
    } else if (pending_validate > 0) {
      j.set_state(v1::Job::VALIDATING);
    } else if (profiles_total > 0 && profiles_failed == profiles_total) {
      j.set_state(v1::Job::FAILED);
      j.set_error(first_error);
    } else if (profiles_total == 0) {
      // No task was ever stored with it (a job of a server that created
      // jobs and tasks in separate transactions and died between them):
      // nothing will run it.
      j.set_state(v1::Job::FAILED);
      j.set_error(
          "the job has no tasks (its submit was interrupted); "
          "submit it again");
    } else {
      j.set_state(v1::Job::SUCCEEDED);
      if (!first_error.empty()) j.set_error(first_error);
    }
    return absl::OkStatus();
  });
}

void JobCore::PublishModelMetrics(const v1::Job& job) {
  metrics_->PublishJobResults(job);
}

}  // namespace mutwo
