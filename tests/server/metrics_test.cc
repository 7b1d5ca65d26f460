// ServerMetrics: every series an alert or panel reads exists at zero from
// construction, the per-model gauges are labelled by batch and budget (one
// job's batch sizes do not overwrite each other), and a server started on a
// store with results exports them before any job runs.
#include "server/metrics.h"

#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(const ServerMetrics& metrics) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, metrics.registry()->Collect());
  return out.str();
}

v1::MemoryBudget Budget(const std::string& text) {
  auto budget = ParseBudget(text);
  EXPECT_TRUE(budget.ok()) << budget.status();
  return *budget;
}

// A finished job: batch 8 and 16, each with a 60% budget that fits (one
// validation round) and a 1B budget that is infeasible.
v1::Job FinishedJob(const std::string& model, int64_t scale) {
  v1::Job job;
  job.mutable_spec()->set_model_name(model);
  job.mutable_spec()->set_model_sha256(Sha256Hex("model bytes"));
  job.set_state(v1::Job::SUCCEEDED);
  for (int64_t batch : {8, 16}) {
    v1::BatchResult* r = job.add_results();
    r->set_batch_size(batch);
    r->set_baseline_peak_bytes(batch * 1000 * scale);
    r->set_baseline_iteration_ms(batch * 2.0);
    for (const char* text : {"60%", "1B"}) {
      const bool fits = std::string(text) == "60%";
      v1::Schedule* s = r->add_schedules();
      s->set_budget_bytes(fits ? batch * 600 * scale : 1);
      s->set_predicted_peak_bytes(batch * 590 * scale);
      s->set_predicted_iteration_ms(batch * 2.5);
      v1::BudgetOutcome* o = r->add_outcomes();
      *o->mutable_budget() = Budget(text);
      o->set_budget_bytes(s->budget_bytes());
      if (fits) {
        o->set_state(v1::BudgetOutcome::FITS);
        o->set_fits(true);
        o->set_rounds(1);
        v1::Validation* v = r->add_validations();
        v->set_budget_bytes(s->budget_bytes());
        v->set_round(1);
        v->mutable_scheduled()->set_peak_bytes(batch * 580 * scale);
        v->mutable_scheduled()->set_iteration_ms(batch * 3.0);
      } else {
        o->set_state(v1::BudgetOutcome::INFEASIBLE);
      }
    }
  }
  job.mutable_max_batch()->set_capacity_bytes(1 << 30);
  job.mutable_max_batch()->set_max_batch_without_checkpointing(100);
  job.mutable_max_batch()->set_max_batch_with_schedule(170);
  return job;
}

TEST(ServerMetricsTest, AlertSeriesExistAtZeroAndNoSummaryIsExported) {
  ServerMetrics metrics;
  const std::string body = Scrape(metrics);
  for (const char* series : {
           "mutwo_workers{state=\"IDLE\"} 0",
           "mutwo_workers{state=\"BUSY\"} 0",
           "mutwo_workers{state=\"LOST\"} 0",
           "mutwo_queue_depth 0",
           "mutwo_jobs_waiting_for_device{device_kind=\"cuda\"} 0",
           "mutwo_auth_refusals_total{reason=\"invalid_token\"} 0",
           "mutwo_validations_total{result=\"failed\"} 0",
           "mutwo_schedule_cache_requests_total{result=\"hit\"} 0",
           "mutwo_long_waits{kind=\"lease\"} 0",
           "mutwo_long_waits_refused_total{kind=\"watch\"} 0",
       }) {
    EXPECT_THAT(body, HasSubstr(series));
  }
  EXPECT_THAT(body, Not(HasSubstr("summary")));
  EXPECT_THAT(body, Not(HasSubstr("quantile")));
  EXPECT_THAT(body, Not(HasSubstr("Nan")));
  EXPECT_THAT(body, Not(HasSubstr("NaN")));
}

TEST(ServerMetricsTest, ModelGaugesAreLabelledByBatchAndBudget) {
  ServerMetrics metrics;
  metrics.PublishJobResults(FinishedJob("resnet", 1));
  const std::string body = Scrape(metrics);
  // Both batch sizes, not the last one written.
  EXPECT_THAT(body, HasSubstr("mutwo_model_peak_bytes{batch=\"8\","
                              "budget=\"none\",kind=\"baseline\","
                              "model=\"resnet\"} 8000"));
  EXPECT_THAT(body, HasSubstr("mutwo_model_peak_bytes{batch=\"16\","
                              "budget=\"none\",kind=\"baseline\","
                              "model=\"resnet\"} 16000"));
  // The measured peak of the round that fits.
  EXPECT_THAT(body, HasSubstr("mutwo_model_peak_bytes{batch=\"16\","
                              "budget=\"60%\",kind=\"planned\","
                              "model=\"resnet\"} 9280"));
  EXPECT_THAT(body, HasSubstr("mutwo_model_iteration_seconds{batch=\"8\","
                              "budget=\"60%\",kind=\"planned\","
                              "model=\"resnet\"} 0.024"));
  // Nothing for a budget that does not fit.
  EXPECT_THAT(body, Not(HasSubstr("budget=\"1 B\"")));
  EXPECT_THAT(body,
              HasSubstr("mutwo_model_max_batch_size{capacity=\"1.00 GiB\","
                        "kind=\"with\",model=\"resnet\"} 170"));
  // A newer job of the same model replaces its figures, per label set.
  metrics.PublishJobResults(FinishedJob("resnet", 2));
  EXPECT_THAT(Scrape(metrics), HasSubstr("mutwo_model_peak_bytes{batch=\"8\","
                                         "budget=\"none\",kind=\"baseline\","
                                         "model=\"resnet\"} 16000"));
}

TEST(ServerMetricsTest, SeriesPerModelAreBounded) {
  ServerMetrics metrics;
  v1::Job job;
  job.mutable_spec()->set_model_name("wide");
  for (int64_t batch = 1; batch <= ServerMetrics::kMaxSeriesPerModel + 10;
       ++batch) {
    v1::BatchResult* r = job.add_results();
    r->set_batch_size(batch);
    r->set_baseline_peak_bytes(batch);
  }
  metrics.PublishJobResults(job);
  const std::string body = Scrape(metrics);
  EXPECT_THAT(body, HasSubstr(absl::StrCat(
                        "batch=\"", ServerMetrics::kMaxSeriesPerModel, "\"")));
  EXPECT_THAT(body,
              Not(HasSubstr(absl::StrCat(
                  "batch=\"", ServerMetrics::kMaxSeriesPerModel + 1, "\""))));
}

// What a restarted server does before its first scrape: the results in the
// store are exported, the newest job's figure winning.
TEST(ServerMetricsTest, StoredResultsArePublishedAtStartUp) {
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   absl::StrCat("mutwo_metrics_", getpid());
  std::filesystem::remove_all(dir);
  storage::Store::Options so;
  so.data_dir = dir.string();
  auto store = storage::Store::Open(so);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string bytes = "model bytes";
  ASSERT_TRUE(
      (*store)->PutModel(Sha256Hex(bytes), "m", bytes.size(), bytes).ok());
  for (int64_t scale : {1, 3}) {  // an older job, then a newer one
    const v1::Job finished = FinishedJob("resnet", scale);
    auto created = (*store)->CreateJob(finished.spec(), "", "");
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_TRUE((*store)
                    ->UpdateJob(created->job.job_id(),
                                [&](v1::Job& j) {
                                  *j.mutable_results() = finished.results();
                                  *j.mutable_max_batch() = finished.max_batch();
                                  j.set_state(v1::Job::SUCCEEDED);
                                  return absl::OkStatus();
                                })
                    .ok());
  }
  (*store)->CreateJob(FinishedJob("queued", 1).spec(), "", "").IgnoreError();

  ServerMetrics metrics;
  ASSERT_TRUE(PublishStoredResults(**store, metrics).ok());
  const std::string body = Scrape(metrics);
  EXPECT_THAT(body, HasSubstr("mutwo_model_peak_bytes{batch=\"16\","
                              "budget=\"none\",kind=\"baseline\","
                              "model=\"resnet\"} 48000"));
  EXPECT_THAT(body, HasSubstr("mutwo_model_peak_bytes{batch=\"8\","
                              "budget=\"60%\",kind=\"planned\","
                              "model=\"resnet\"} 13920"));
  EXPECT_THAT(body, Not(HasSubstr("model=\"queued\"")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mutwo
