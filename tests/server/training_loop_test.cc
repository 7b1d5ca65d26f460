// Reports of schedules measured in users' training loops
// (server/training_loop.h) on hand-made jobs: what is checked, the
// server's verdict, the outcome's fields and what is kept.
#include "server/training_loop.h"

#include "common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBudget = 1 << 20;

v1::Job JobWithOneFit() {
  v1::Job job;
  job.set_job_id("j1");
  v1::BatchResult& r = *job.add_results();
  r.set_batch_size(8);
  v1::Schedule& s = *r.add_schedules();
  *s.mutable_budget() = *ParseBudget("60%");
  s.set_budget_bytes(kBudget);
  s.set_graph_fingerprint("abc");
  v1::BudgetOutcome& o = *r.add_outcomes();
  *o.mutable_budget() = s.budget();
  o.set_budget_bytes(kBudget);
  o.set_state(v1::BudgetOutcome::FITS);
  return job;
}

v1::TrainingLoopValidation Report(int64_t peak) {
  v1::TrainingLoopValidation t;
  t.set_path(v1::TrainingLoopValidation::EAGER);
  v1::MemoryBudget budget = *ParseBudget("60%");
  budget.clear_text();  // the budget kind is compared, not its spelling
  *t.mutable_budget() = budget;
  t.set_decisions_planned(5);
  t.set_decisions_applied(5);
  v1::Validation& v = *t.mutable_validation();
  v.set_batch_size(8);
  v.set_budget_bytes(kBudget);
  v.set_graph_fingerprint("abc");
  v.mutable_scheduled()->set_peak_bytes(peak);
  v.mutable_scheduled()->set_iteration_ms(12.5);
  v.set_within_budget(true);  // the client's claim; the server judges
  v.set_gradients_match(true);
  v.set_batchnorm_stats_match(true);
  return t;
}

TEST(TrainingLoopTest, AReportWithinTheBudgetHoldsAndMarksTheOutcome) {
  v1::Job job = JobWithOneFit();
  v1::TrainingLoopValidation t = Report(kBudget - 1);
  auto outcome = AddTrainingLoopReport(job, t);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(t.holds());
  EXPECT_EQ(t.problem(), "");
  EXPECT_TRUE(outcome->validated_in_training_loop());
  EXPECT_EQ(outcome->training_loop_peak_bytes(), kBudget - 1);
  EXPECT_EQ(outcome->training_loop_reports(), 1);
  EXPECT_EQ(outcome->state(), v1::BudgetOutcome::FITS);  // the worker's
  ASSERT_EQ(job.results(0).training_loop_size(), 1);
  EXPECT_TRUE(job.results(0).outcomes(0).validated_in_training_loop());
}

TEST(TrainingLoopTest, TheServerJudgesThePeakAndTheDecisionsNotTheClient) {
  v1::Job job = JobWithOneFit();
  v1::TrainingLoopValidation first = Report(kBudget);
  ASSERT_TRUE(AddTrainingLoopReport(job, first).ok());
  EXPECT_TRUE(first.holds());  // at the budget exactly
  v1::TrainingLoopValidation t = Report(kBudget + kBudget / 10);
  t.set_decisions_applied(3);
  t.mutable_validation()->set_gradients_match(false);
  t.mutable_validation()->set_max_abs_grad_diff(0.5);
  auto outcome = AddTrainingLoopReport(job, t);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(t.holds());
  EXPECT_FALSE(t.validation().within_budget());
  EXPECT_THAT(t.problem(),
              HasSubstr("measured peak 1.10 MiB exceeds the budget 1.00 MiB "
                        "by 10.0%"));
  EXPECT_THAT(t.problem(), HasSubstr("gradients (max |diff| 0.5)"));
  EXPECT_THAT(t.problem(), HasSubstr("2 of 5 decisions not applied"));
  // The newest report decides; both are kept.
  EXPECT_FALSE(outcome->validated_in_training_loop());
  EXPECT_EQ(outcome->training_loop_reports(), 2);
  EXPECT_EQ(job.results(0).training_loop_size(), 2);
}

TEST(TrainingLoopTest, ReportsThatDoNotNameTheJobsScheduleAreRefused) {
  const v1::Job original = JobWithOneFit();
  struct Case {
    const char* name;
    void (*edit)(v1::TrainingLoopValidation&);
    absl::StatusCode code;
    const char* says;
  };
  const Case cases[] = {
      {"no path", [](v1::TrainingLoopValidation& t) { t.clear_path(); },
       absl::StatusCode::kInvalidArgument, "report.path: not set"},
      {"other batch",
       [](v1::TrainingLoopValidation& t) {
         t.mutable_validation()->set_batch_size(16);
       },
       absl::StatusCode::kInvalidArgument,
       "report.validation.batch_size: job j1 has no result at batch size 16 "
       "(it has 8)"},
      {"other budget",
       [](v1::TrainingLoopValidation& t) {
         *t.mutable_budget() = *ParseBudget("50%");
       },
       absl::StatusCode::kInvalidArgument,
       "report.budget: job j1 has no budget \"50%\" at batch size 8 (its "
       "budgets: 60%)"},
      {"other graph",
       [](v1::TrainingLoopValidation& t) {
         t.mutable_validation()->set_graph_fingerprint("zzz");
       },
       absl::StatusCode::kFailedPrecondition,
       "report.validation.graph_fingerprint \"zzz\" is not the graph"},
      {"stale budget",
       [](v1::TrainingLoopValidation& t) {
         t.mutable_validation()->set_budget_bytes(kBudget + 1);
       },
       absl::StatusCode::kFailedPrecondition, "fetch the schedule again"},
      {"more applied than planned",
       [](v1::TrainingLoopValidation& t) { t.set_decisions_applied(6); },
       absl::StatusCode::kInvalidArgument, "report.decisions_applied: 6 of 5"},
      {"negative time",
       [](v1::TrainingLoopValidation& t) {
         t.mutable_validation()->mutable_scheduled()->set_iteration_ms(-1);
       },
       absl::StatusCode::kInvalidArgument,
       "report.validation.scheduled.iteration_ms"},
      {"no peak",
       [](v1::TrainingLoopValidation& t) {
         t.mutable_validation()->mutable_scheduled()->set_peak_bytes(0);
       },
       absl::StatusCode::kInvalidArgument,
       "report.validation.scheduled.peak_bytes: 0"},
  };
  for (const Case& c : cases) {
    v1::Job job = original;
    v1::TrainingLoopValidation t = Report(100);
    c.edit(t);
    auto outcome = AddTrainingLoopReport(job, t);
    ASSERT_FALSE(outcome.ok()) << c.name;
    EXPECT_EQ(outcome.status().code(), c.code) << c.name;
    EXPECT_THAT(std::string(outcome.status().message()), HasSubstr(c.says))
        << c.name;
    EXPECT_EQ(job.SerializeAsString(), original.SerializeAsString()) << c.name;
  }
}

// Re-planning helps only a report whose one problem is its peak: then the
// loop's overshoot over the prediction plus the margin, at least the
// schedule's own correction grown by the margin.
TEST(TrainingLoopTest, OnlyAPeakOverTheBudgetAsksForACorrection) {
  v1::Job job = JobWithOneFit();
  v1::Schedule& s = *job.mutable_results(0)->mutable_schedules(0);
  s.set_predicted_peak_bytes(kBudget - 100000);
  s.set_correction_bytes(5000);
  v1::Schedule ran;
  v1::TrainingLoopValidation over = Report(kBudget + 50000);
  ASSERT_TRUE(AddTrainingLoopReport(job, over, &ran).ok());
  EXPECT_EQ(ran.predicted_peak_bytes(), kBudget - 100000);
  const int64_t margin = (kBudget + 99) / 100;  // 1% of the budget
  EXPECT_EQ(TrainingLoopCorrection(ran, over, 0.01), 150000 + margin);
  // A small overshoot still grows the schedule's own correction.
  v1::TrainingLoopValidation barely = Report(kBudget + 1);
  ran.set_predicted_peak_bytes(kBudget);
  ASSERT_TRUE(AddTrainingLoopReport(job, barely).ok());
  EXPECT_EQ(TrainingLoopCorrection(ran, barely, 0.01), 5000 + margin);
  // Nothing to correct by planning lower.
  v1::TrainingLoopValidation holds = Report(kBudget);
  ASSERT_TRUE(AddTrainingLoopReport(job, holds).ok());
  EXPECT_EQ(TrainingLoopCorrection(ran, holds, 0.01), 0);
  v1::TrainingLoopValidation wrong = Report(kBudget + 50000);
  wrong.mutable_validation()->set_gradients_match(false);
  ASSERT_TRUE(AddTrainingLoopReport(job, wrong).ok());
  EXPECT_EQ(TrainingLoopCorrection(ran, wrong, 0.01), 0);
  v1::TrainingLoopValidation unapplied = Report(kBudget + 50000);
  unapplied.set_decisions_applied(4);
  ASSERT_TRUE(AddTrainingLoopReport(job, unapplied).ok());
  EXPECT_EQ(TrainingLoopCorrection(ran, unapplied, 0.01), 0);
  v1::TrainingLoopValidation oom = Report(kBudget + 50000);
  oom.mutable_validation()->set_oom(true);
  ASSERT_TRUE(AddTrainingLoopReport(job, oom).ok());
  EXPECT_EQ(TrainingLoopCorrection(ran, oom, 0.01), 0);
}

TEST(TrainingLoopTest, OnlyTheNewestReportsAreKept) {
  v1::Job job = JobWithOneFit();
  for (int i = 1; i <= kTrainingLoopReportsKept + 3; ++i) {
    v1::TrainingLoopValidation t = Report(i);
    ASSERT_TRUE(AddTrainingLoopReport(job, t).ok());
  }
  const v1::BatchResult& r = job.results(0);
  ASSERT_EQ(r.training_loop_size(), kTrainingLoopReportsKept);
  EXPECT_EQ(r.training_loop(0).validation().scheduled().peak_bytes(), 4);
  EXPECT_EQ(r.outcomes(0).training_loop_reports(),
            kTrainingLoopReportsKept + 3);
}

}  // namespace
}  // namespace mutwo
