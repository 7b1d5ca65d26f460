// What `submit --wait` and `watch` print and the exit code they return.
#include "client/job_watch.h"

#include <sstream>

#include "common/args.h"
#include "common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

v1::Job FinishedJob(v1::BudgetOutcome::State at8,
                    v1::BudgetOutcome::State at16) {
  v1::Job job;
  job.set_job_id("job-7");
  job.set_state(v1::Job::SUCCEEDED);
  job.mutable_spec()->add_batch_sizes(8);
  job.mutable_spec()->add_batch_sizes(16);
  *job.mutable_spec()->add_budgets() = *ParseBudget("60%");
  *job.mutable_spec()->add_budgets() = *ParseBudget("1GiB");
  for (auto [batch, state] : {std::pair{8, at8}, std::pair{16, at16}}) {
    v1::BatchResult* r = job.add_results();
    r->set_batch_size(batch);
    v1::BudgetOutcome* pct = r->add_outcomes();
    *pct->mutable_budget() = *ParseBudget("60%");
    pct->set_state(state);
    v1::BudgetOutcome* bytes = r->add_outcomes();
    *bytes->mutable_budget() = *ParseBudget("1GiB");
    bytes->set_state(v1::BudgetOutcome::FITS);
  }
  return job;
}

TEST(FinishedJobExitCode, ZeroWhenEveryBudgetFitsSomewhere) {
  std::ostringstream err;
  const v1::Job job =
      FinishedJob(v1::BudgetOutcome::OVER_BUDGET, v1::BudgetOutcome::FITS);
  EXPECT_TRUE(BudgetsFittingNowhere(job).empty());
  EXPECT_EQ(FinishedJobExitCode(job, err), kExitOk);
  EXPECT_EQ(err.str(), "");
}

TEST(FinishedJobExitCode, ThreeWhenABudgetFitsAtNoBatchSize) {
  std::ostringstream err;
  const v1::Job job = FinishedJob(v1::BudgetOutcome::INFEASIBLE,
                                  v1::BudgetOutcome::OVER_BUDGET);
  EXPECT_THAT(BudgetsFittingNowhere(job), ::testing::ElementsAre("60%"));
  EXPECT_EQ(FinishedJobExitCode(job, err), kExitInfeasible);
  EXPECT_EQ(err.str(),
            "mutwo: job job-7: budget 60% fits at no batch size (8, 16); see "
            "the table for why\n");
}

TEST(FinishedJobExitCode, OneWhenTheJobFailedOrWasCancelled) {
  std::ostringstream err;
  v1::Job job = FinishedJob(v1::BudgetOutcome::FITS, v1::BudgetOutcome::FITS);
  job.set_state(v1::Job::FAILED);
  EXPECT_EQ(FinishedJobExitCode(job, err), kExitFailure);
  job.set_state(v1::Job::CANCELLED);
  EXPECT_EQ(FinishedJobExitCode(job, err), kExitFailure);
}

TEST(ProgressLine, TimeElapsedStageCountsAndWhatRuns) {
  v1::JobEvent e;
  e.set_state(v1::Job::VALIDATING);
  e.set_unix_ms(1'700'000'083'000);
  e.set_batch_sizes_total(3);
  e.set_batch_sizes_profiled(2);
  e.set_budgets_total(6);
  e.set_budgets_decided(1);
  e.set_running("validate batch 8 budget 60%");
  const std::string line = ProgressLine(e, 1'700'000'000'000);
  EXPECT_THAT(line, ::testing::MatchesRegex(
                        "[0-9]{2}:[0-9]{2}:[0-9]{2} \\+1m23s  VALIDATING  "
                        "profiled 2/3 batch sizes, 1/6 budgets decided, "
                        "~2m46s left; running validate batch 8 budget 60%"));
  // 3 of 9 units in 83 s: 6 more take 166 s. None before the first unit,
  // when the start is unknown, or once the job is final.
  v1::JobEvent first = e;
  first.set_batch_sizes_profiled(0);
  first.set_budgets_decided(0);
  EXPECT_THAT(ProgressLine(first, 1'700'000'000'000),
              ::testing::Not(HasSubstr("left")));
  EXPECT_THAT(ProgressLine(e, 0), ::testing::Not(HasSubstr("left")));
  v1::JobEvent done = e;
  done.set_state(v1::Job::SUCCEEDED);
  EXPECT_THAT(ProgressLine(done, 1'700'000'000'000),
              ::testing::Not(HasSubstr("left")));
  // A job without budgets: no "0/0 budgets decided".
  v1::JobEvent no_budgets = e;
  no_budgets.set_budgets_total(0);
  no_budgets.set_budgets_decided(0);
  EXPECT_THAT(ProgressLine(no_budgets, 1'700'000'000'000),
              HasSubstr("profiled 2/3 batch sizes, ~"));
  // A server without the counts: its message.
  v1::JobEvent old;
  old.set_state(v1::Job::PROFILING);
  old.set_message("PROFILING 1/3 tasks");
  EXPECT_THAT(ProgressLine(old, 0), HasSubstr("PROFILING 1/3 tasks"));
}

}  // namespace
}  // namespace mutwo
