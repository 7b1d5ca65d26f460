#include "server/metrics.h"

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "common/validation_check.h"
#include "common/version.h"

namespace mutwo {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

const std::set<std::string>& JobStates() {
  static const auto* const kStates = new std::set<std::string>{
      "QUEUED",    "PROFILING", "PLANNING", "VALIDATING",
      "SUCCEEDED", "FAILED",    "CANCELLED"};
  return *kStates;
}
const std::set<std::string>& TaskStates() {
  static const auto* const kStates = new std::set<std::string>{
      "QUEUED", "LEASED", "DONE", "FAILED", "CANCELLED"};
  return *kStates;
}
const std::set<std::string>& WorkerStates() {
  static const auto* const kStates =
      new std::set<std::string>{"IDLE", "BUSY", "LOST"};
  return *kStates;
}

Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
}

}  // namespace

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      jobs_(BuildGauge()
                .Name("mutwo_jobs")
                .Help("Jobs by state")
                .Register(*registry_)),
      tasks_(BuildGauge()
                 .Name("mutwo_tasks")
                 .Help("Tasks by state")
                 .Register(*registry_)),
      workers_(BuildGauge()
                   .Name("mutwo_workers")
                   .Help("Registered workers by state")
                   .Register(*registry_)),
      queue_depth_(BuildGauge()
                       .Name("mutwo_queue_depth")
                       .Help("Tasks waiting for a worker")
                       .Register(*registry_)
                       .Add({})),
      tasks_in_flight_(BuildGauge()
                           .Name("mutwo_tasks_in_flight")
                           .Help("Tasks leased to a worker")
                           .Register(*registry_)
                           .Add({})),
      model_store_bytes_(BuildGauge()
                             .Name("mutwo_model_store_bytes")
                             .Help("Bytes of stored model files")
                             .Register(*registry_)
                             .Add({})),
      jobs_waiting_for_device_(
          BuildGauge()
              .Name("mutwo_jobs_waiting_for_device")
              .Help("Unfinished jobs with queued tasks that no live worker "
                    "can run, by the device kind they ask for")
              .Register(*registry_)),
      rpc_seconds_(BuildHistogram()
                       .Name("mutwo_rpc_duration_seconds")
                       .Help("RPC handling time by method and status code")
                       .Register(*registry_)),
      planner_seconds_(BuildHistogram()
                           .Name("mutwo_planner_duration_seconds")
                           .Help("Time to plan one schedule")
                           .Register(*registry_)
                           .Add({}, LatencyBuckets())),
      cache_(BuildCounter()
                 .Name("mutwo_schedule_cache_requests_total")
                 .Help("Schedule cache lookups by result (hit, miss)")
                 .Register(*registry_)),
      validations_(BuildCounter()
                       .Name("mutwo_validations_total")
                       .Help("Validation rounds reported, by result: fits "
                             "(within the budget, matching the unmodified "
                             "step), over_budget, failed")
                       .Register(*registry_)),
      uploads_(BuildCounter()
                   .Name("mutwo_model_uploads_total")
                   .Help("Model uploads by result (stored, deduplicated)")
                   .Register(*registry_)),
      auth_refusals_(BuildCounter()
                         .Name("mutwo_auth_refusals_total")
                         .Help("Calls refused by the bearer-token check "
                               "before any handler ran, by reason "
                               "(missing_token, invalid_token, malformed, "
                               "no_client_certificate)")
                         .Register(*registry_)),
      long_waits_(BuildGauge()
                      .Name("mutwo_long_waits")
                      .Help("LeaseTask polls (kind=lease) and WatchJob "
                            "streams (kind=watch) open now; none holds a "
                            "thread")
                      .Register(*registry_)),
      long_waits_refused_(BuildCounter()
                              .Name("mutwo_long_waits_refused_total")
                              .Help("Polls and watches refused with "
                                    "RESOURCE_EXHAUSTED at their limit "
                                    "(--max_lease_waiters, --max_watchers)")
                              .Register(*registry_)),
      limit_refusals_(BuildCounter()
                          .Name("mutwo_limit_refusals_total")
                          .Help("Requests refused at one of the server's "
                                "limits, by the flag that sets it (limit="
                                "max_watchers_per_client, ...)")
                          .Register(*registry_)),
      workers_quarantined_(BuildGauge()
                               .Name("mutwo_workers_quarantined")
                               .Help("Workers leased nothing because their "
                                     "tasks failed or their reports were "
                                     "refused too often "
                                     "(--worker_quarantine_failures)")
                               .Register(*registry_)
                               .Add({})),
      worker_quarantines_(BuildCounter()
                              .Name("mutwo_worker_quarantines_total")
                              .Help("Workers put in quarantine")
                              .Register(*registry_)
                              .Add({})),
      profile_disagreements_(
          BuildCounter()
              .Name("mutwo_profile_disagreements_total")
              .Help("Profiles whose measured peak disagrees with another "
                    "measurement of the same model, spec, batch size and "
                    "device by more than --profile_agreement_tolerance; "
                    "schedules of that key are no longer shared across "
                    "tenants")
              .Register(*registry_)
              .Add({})),
      model_peak_bytes_(BuildGauge()
                            .Name("mutwo_model_peak_bytes")
                            .Help("Peak training-step memory per model, "
                                  "batch size, budget and kind (baseline, "
                                  "planned, training_loop)")
                            .Register(*registry_)),
      model_iteration_seconds_(
          BuildGauge()
              .Name("mutwo_model_iteration_seconds")
              .Help("Training-step time per model, batch size, budget and "
                    "kind (baseline, planned, training_loop)")
              .Register(*registry_)),
      model_max_batch_(BuildGauge()
                           .Name("mutwo_model_max_batch_size")
                           .Help("Predicted largest batch per model and "
                                 "device capacity, without and with a "
                                 "schedule")
                           .Register(*registry_)) {
  BuildGauge()
      .Name("mutwo_build_info")
      .Help("Build facts; value is always 1")
      .Register(*registry_)
      .Add({{"version", kVersion}, {"planner_version", kPlannerVersion}})
      .Set(1);
  cache_.Add({{"result", "hit"}});
  cache_.Add({{"result", "miss"}});
  cache_.Add({{"result", "shared_hit"}});
  for (const char* result : {"fits", "over_budget", "failed"}) {
    validations_.Add({{"result", result}});
  }
  uploads_.Add({{"result", "stored"}});
  uploads_.Add({{"result", "deduplicated"}});
  // At zero from the start, so rates (and the refusal alert) work from the
  // first refusal.
  for (const char* reason : {"missing_token", "invalid_token", "malformed",
                             "no_client_certificate"}) {
    auth_refusals_.Add({{"reason", reason}});
  }
  for (const char* kind : {"lease", "watch"}) {
    long_waits_.Add({{"kind", kind}});
    long_waits_refused_.Add({{"kind", kind}});
  }
  for (const std::string& limit : LimitNames()) {
    limit_refusals_.Add({{"limit", limit}});
  }
  SetJobs({});
  SetTasks({});
  SetWorkers({});
  SetJobsWaitingForDevice({});
}

void ServerMetrics::SetByState(prometheus::Family<prometheus::Gauge>& family,
                               const std::map<std::string, int64_t>& by_state,
                               const std::set<std::string>& all_states) {
  for (const std::string& state : all_states) {
    auto it = by_state.find(state);
    family.Add({{"state", state}})
        .Set(it == by_state.end() ? 0 : static_cast<double>(it->second));
  }
}

void ServerMetrics::SetJobs(const std::map<std::string, int64_t>& by_state) {
  SetByState(jobs_, by_state, JobStates());
}

void ServerMetrics::SetTasks(const std::map<std::string, int64_t>& by_state) {
  SetByState(tasks_, by_state, TaskStates());
  auto get = [&](const char* s) {
    auto it = by_state.find(s);
    return it == by_state.end() ? 0.0 : static_cast<double>(it->second);
  };
  queue_depth_.Set(get("QUEUED"));
  tasks_in_flight_.Set(get("LEASED"));
}

void ServerMetrics::SetWorkers(const std::map<std::string, int64_t>& by_state) {
  SetByState(workers_, by_state, WorkerStates());
}

void ServerMetrics::SetModelStoreBytes(int64_t bytes) {
  model_store_bytes_.Set(static_cast<double>(bytes));
}

void ServerMetrics::SetJobsWaitingForDevice(
    const std::map<std::string, int64_t>& by_kind) {
  static const auto* const kKinds =
      new std::set<std::string>{"cpu", "cuda", "any"};
  std::set<std::string> kinds = *kKinds;
  for (const auto& [kind, n] : by_kind) kinds.insert(kind);
  for (const std::string& kind : kinds) {
    auto it = by_kind.find(kind);
    jobs_waiting_for_device_.Add({{"device_kind", kind}})
        .Set(it == by_kind.end() ? 0 : static_cast<double>(it->second));
  }
}

void ServerMetrics::ObserveRpc(const std::string& method,
                               const std::string& code, double seconds) {
  rpc_seconds_.Add({{"method", method}, {"code", code}}, LatencyBuckets())
      .Observe(seconds);
}

void ServerMetrics::ObservePlanner(double seconds) {
  planner_seconds_.Observe(seconds);
}

void ServerMetrics::CountCache(bool hit) {
  cache_.Add({{"result", hit ? "hit" : "miss"}}).Increment();
}

void ServerMetrics::CountValidation(const std::string& result) {
  validations_.Add({{"result", result}}).Increment();
}

void ServerMetrics::CountAuthRefusal(const std::string& reason) {
  auth_refusals_.Add({{"reason", reason}}).Increment();
}

void ServerMetrics::SetLongWaits(const std::string& kind, int open) {
  long_waits_.Add({{"kind", kind}}).Set(open);
}

void ServerMetrics::CountLongWaitRefused(const std::string& kind) {
  long_waits_refused_.Add({{"kind", kind}}).Increment();
  CountLimitRefusal(kind == "lease" ? "max_lease_waiters" : "max_watchers");
}

const std::vector<std::string>& ServerMetrics::LimitNames() {
  static const auto* const kNames =
      new std::vector<std::string>{"max_lease_waiters",
                                   "max_watchers",
                                   "max_lease_waiters_per_worker",
                                   "max_watchers_per_client",
                                   "max_profile_nodes",
                                   "max_profile_edges",
                                   "max_report_plan_bytes",
                                   "max_stored_model_bytes_per_client",
                                   "upload_idle_timeout_ms"};
  return *kNames;
}

void ServerMetrics::SetWorkersQuarantined(int n) {
  workers_quarantined_.Set(n);
}

void ServerMetrics::CountWorkerQuarantined() {
  worker_quarantines_.Increment();
}

void ServerMetrics::CountSharedCacheHit() {
  cache_.Add({{"result", "shared_hit"}}).Increment();
}

void ServerMetrics::CountProfileDisagreement() {
  profile_disagreements_.Increment();
}

void ServerMetrics::CountLimitRefusal(const std::string& limit) {
  limit_refusals_.Add({{"limit", limit}}).Increment();
}

void ServerMetrics::CountUpload(bool stored) {
  uploads_.Add({{"result", stored ? "stored" : "deduplicated"}}).Increment();
}

std::string ServerMetrics::ModelLabel(const std::string& model) {
  const std::string name = model.empty() ? "unnamed" : model;
  absl::MutexLock lock(&mu_);
  if (model_labels_.count(name) > 0) return name;
  if (static_cast<int>(model_labels_.size()) < kMaxModelLabels) {
    model_labels_.insert(name);
    return name;
  }
  return "other";
}

bool ServerMetrics::AdmitSeries(const std::string& model,
                                const std::string& batch,
                                const std::string& budget) {
  absl::MutexLock lock(&mu_);
  auto& pairs = model_series_[model];
  if (pairs.count({batch, budget}) > 0) return true;
  if (static_cast<int>(pairs.size()) >= kMaxSeriesPerModel) return false;
  pairs.insert({batch, budget});
  return true;
}

void ServerMetrics::PublishJobResults(const v1::Job& job) {
  const std::string model = ModelLabel(job.spec().model_name());
  auto set = [&](const std::string& kind, int64_t batch_size,
                 const std::string& budget, int64_t peak_bytes,
                 double iteration_ms) {
    const std::string batch = absl::StrCat(batch_size);
    if (!AdmitSeries(model, batch, budget)) return;
    const prometheus::Labels labels = {
        {"model", model}, {"kind", kind}, {"batch", batch}, {"budget", budget}};
    model_peak_bytes_.Add(labels).Set(static_cast<double>(peak_bytes));
    model_iteration_seconds_.Add(labels).Set(iteration_ms / 1000.0);
  };
  for (const v1::BatchResult& r : job.results()) {
    if (r.baseline_peak_bytes() > 0) {
      set("baseline", r.batch_size(), "none", r.baseline_peak_bytes(),
          r.baseline_iteration_ms());
    }
    for (int i = 0; i < r.outcomes_size() && i < r.schedules_size(); ++i) {
      const v1::BudgetOutcome& o = r.outcomes(i);
      const v1::Schedule& s = r.schedules(i);
      const std::string budget = FormatBudget(o.budget());
      if (o.state() == v1::BudgetOutcome::VALIDATING) {
        set("planned", r.batch_size(), budget, s.predicted_peak_bytes(),
            s.predicted_iteration_ms());
      } else if (o.fits()) {
        for (const v1::Validation& v : r.validations()) {
          if (IsOutcomeRound(v, o)) {
            set("planned", r.batch_size(), budget, v.scheduled().peak_bytes(),
                v.scheduled().iteration_ms());
          }
        }
      }
    }
    // The newest training-loop report per budget (kept oldest first).
    for (const v1::TrainingLoopValidation& t : r.training_loop()) {
      if (t.validation().oom()) continue;
      set("training_loop", r.batch_size(), FormatBudget(t.budget()),
          t.validation().scheduled().peak_bytes(),
          t.validation().scheduled().iteration_ms());
    }
  }
  if (job.has_max_batch()) {
    const v1::MaxBatchPrediction& m = job.max_batch();
    const std::string capacity = FormatBytes(m.capacity_bytes());
    model_max_batch_
        .Add({{"model", model}, {"kind", "without"}, {"capacity", capacity}})
        .Set(static_cast<double>(m.max_batch_without_checkpointing()));
    model_max_batch_
        .Add({{"model", model}, {"kind", "with"}, {"capacity", capacity}})
        .Set(static_cast<double>(m.max_batch_with_schedule()));
  }
}

absl::Status PublishStoredResults(storage::Store& store,
                                  ServerMetrics& metrics) {
  std::vector<v1::Job> jobs;
  storage::ListJobsQuery query;
  query.page_size = storage::Store::kMaxPageSize;
  do {
    MUTWO_ASSIGN_OR_RETURN(storage::JobPage page, store.ListJobs(query));
    for (v1::Job& job : page.jobs) {
      if (job.results_size() > 0 || job.has_max_batch()) {
        jobs.push_back(std::move(job));
      }
    }
    query.page_token = page.next_page_token;
  } while (!query.page_token.empty());
  for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
    metrics.PublishJobResults(*it);
  }
  return absl::OkStatus();
}

}  // namespace mutwo
