// ServerMetrics: every Prometheus metric mutwo-server exports, in one place.
// Names follow Prometheus conventions (mutwo_ prefix, base units, _total for
// counters; histograms, never summaries, so no quantile is ever NaN). Every
// series an alert or a dashboard panel reads exists from construction, at 0.
// Per-model series use the job's model name as a bounded label: at most
// kMaxModelLabels distinct names, later ones fold into "other"; each model
// has at most kMaxSeriesPerModel (batch, budget) pairs, later pairs are not
// exported. They are labelled by batch and budget, so two batch sizes or
// budgets of one model never overwrite each other; the same (model, batch,
// budget) from a newer job replaces the older figure. At start-up
// PublishStoredResults() rebuilds them from the store.
// Thread-safe (prometheus-cpp metrics are atomic; the label maps have a
// mutex).
#ifndef MUTWO_SERVER_METRICS_H_
#define MUTWO_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "mutwo/v1/types.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "storage/store.h"

namespace mutwo {

class ServerMetrics {
 public:
  static constexpr int kMaxModelLabels = 50;
  static constexpr int kMaxSeriesPerModel = 200;

  ServerMetrics();
  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }

  // Gauges refreshed from the store (counts by state).
  void SetJobs(const std::map<std::string, int64_t>& by_state);
  void SetTasks(const std::map<std::string, int64_t>& by_state);
  void SetWorkers(const std::map<std::string, int64_t>& by_state);
  void SetModelStoreBytes(int64_t bytes);
  // Unfinished jobs whose queued tasks no live worker can run, by device
  // kind label (cpu, cuda, any): JobsWaitingForDevice().
  void SetJobsWaitingForDevice(const std::map<std::string, int64_t>& by_kind);

  void ObserveRpc(const std::string& method, const std::string& code,
                  double seconds);
  void ObservePlanner(double seconds);
  void CountCache(bool hit);
  // A job's own entry missed and a shared entry (planned from a trusted
  // profile of another job) answered it: result="shared_hit".
  void CountSharedCacheHit();
  // A profile whose measured peak disagrees with another measurement of the
  // same model, spec, batch size and device (server/profile_trust.h).
  void CountProfileDisagreement();
  // One validation round: "fits", "over_budget" or "failed".
  void CountValidation(const std::string& result);
  void CountUpload(bool stored);
  // A call refused by the token check before any handler ran (reason:
  // missing_token, invalid_token, malformed, no_client_certificate).
  void CountAuthRefusal(const std::string& reason);
  // Long waits (kind: lease, watch) open now, and those refused at their
  // limit (--max_lease_waiters, --max_watchers).
  void SetLongWaits(const std::string& kind, int open);
  void CountLongWaitRefused(const std::string& kind);
  // A request refused at one of the server's limits, named by the flag that
  // sets it without the dashes (max_watchers, max_watchers_per_client, ...;
  // kLimitNames lists them, each exported from the start at 0).
  void CountLimitRefusal(const std::string& limit);
  static const std::vector<std::string>& LimitNames();
  // Workers in quarantine now (worker_quarantine.h), and each new one.
  void SetWorkersQuarantined(int n);
  void CountWorkerQuarantined();

  // Per model, batch size and budget: peak bytes and iteration seconds of
  // kind "baseline" (budget="none") and "planned" (measured by the last
  // validation round that fits; predicted while a round runs; nothing for a
  // budget that does not fit), "training_loop" (the newest report of the
  // schedule measured in a user's training loop, ReportTrainingLoop), and
  // the max batch "without" / "with"
  // checkpointing under the job's capacity. Called whenever a job's results
  // change.
  void PublishJobResults(const v1::Job& job);

 private:
  std::string ModelLabel(const std::string& model);
  // False when `model` already has kMaxSeriesPerModel other pairs.
  bool AdmitSeries(const std::string& model, const std::string& batch,
                   const std::string& budget);
  static void SetByState(prometheus::Family<prometheus::Gauge>& family,
                         const std::map<std::string, int64_t>& by_state,
                         const std::set<std::string>& all_states);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& tasks_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& tasks_in_flight_;
  prometheus::Gauge& model_store_bytes_;
  prometheus::Family<prometheus::Gauge>& jobs_waiting_for_device_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Histogram& planner_seconds_;
  prometheus::Family<prometheus::Counter>& cache_;
  prometheus::Family<prometheus::Counter>& validations_;
  prometheus::Family<prometheus::Counter>& uploads_;
  prometheus::Family<prometheus::Counter>& auth_refusals_;
  prometheus::Family<prometheus::Gauge>& long_waits_;
  prometheus::Family<prometheus::Counter>& long_waits_refused_;
  prometheus::Family<prometheus::Counter>& limit_refusals_;
  prometheus::Gauge& workers_quarantined_;
  prometheus::Counter& worker_quarantines_;
  prometheus::Counter& profile_disagreements_;
  prometheus::Family<prometheus::Gauge>& model_peak_bytes_;
  prometheus::Family<prometheus::Gauge>& model_iteration_seconds_;
  prometheus::Family<prometheus::Gauge>& model_max_batch_;

  absl::Mutex mu_;
  std::set<std::string> model_labels_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::pair<std::string, std::string>>>
      model_series_ ABSL_GUARDED_BY(mu_);
};

// Publishes the results of every stored job, oldest first (so the newest
// job's figure wins for a (model, batch, budget)): the model gauges of a
// restarted server match those it exported before. Errors of the store.
[[nodiscard]] absl::Status PublishStoredResults(storage::Store& store,
                                                ServerMetrics& metrics);

}  // namespace mutwo

#endif  // MUTWO_SERVER_METRICS_H_
