// What `submit --wait` and `watch` print and the exit code they return.
#include "client/job_watch.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
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

namespace progress_printer {

v1::JobEvent Event(v1::Job::State state, int profiled, int decided,
                   int64_t at_s, const std::string& running = "") {
  v1::JobEvent e;
  e.set_state(state);
  e.set_unix_ms(1'700'000'000'000 + at_s * 1000);
  e.set_batch_sizes_total(2);
  e.set_batch_sizes_profiled(profiled);
  e.set_budgets_total(4);
  e.set_budgets_decided(decided);
  e.set_running(running);
  return e;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// A task's report (the count goes up, nothing runs) and the next lease (the
// same count, the next task runs) a moment apart are one step: one line,
// naming the task that runs.
TEST(ProgressPrinter, OneLinePerStepNotOnePerReportAndLease) {
  std::ostringstream out;
  ProgressPrinter printer(1'700'000'000'000, out);
  printer.Add(Event(v1::Job::PROFILING, 0, 0, 1, "profile batch 8"));
  printer.Add(Event(v1::Job::PROFILING, 1, 0, 10));
  printer.Add(Event(v1::Job::PROFILING, 1, 0, 10, "profile batch 16"));
  printer.Add(Event(v1::Job::PROFILING, 1, 0, 11, "profile batch 16"));
  printer.Add(Event(v1::Job::PLANNING, 2, 0, 20));
  printer.Add(Event(v1::Job::VALIDATING, 2, 1, 30));
  printer.Add(Event(v1::Job::VALIDATING, 2, 1, 30, "validate batch 8"));
  printer.Add(Event(v1::Job::VALIDATING, 2, 2, 40));  // no lease follows
  printer.Add(Event(v1::Job::SUCCEEDED, 2, 4, 50));
  printer.Flush();
  const std::vector<std::string> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 6u) << out.str();
  EXPECT_THAT(lines[0], HasSubstr("profiled 0/2 batch sizes, 0/4 budgets "
                                  "decided; running profile batch 8"));
  EXPECT_THAT(lines[1], HasSubstr("profiled 1/2 batch sizes, 0/4 budgets "
                                  "decided, ~50s left; running profile "
                                  "batch 16"));
  EXPECT_THAT(lines[2], HasSubstr("PLANNING"));
  EXPECT_THAT(lines[3], HasSubstr("1/4 budgets decided, ~30s left; running "
                                  "validate batch 8"));
  EXPECT_THAT(lines[4], HasSubstr("2/4 budgets decided"));  // printed anyway
  EXPECT_THAT(lines[5], HasSubstr("SUCCEEDED"));
}

// The raw estimate rises when a step is slower than those before; the line
// shows the previous estimate counted down instead, and says when that ran
// out rather than showing a larger number.
TEST(ProgressPrinter, TimeLeftNeverGoesUp) {
  std::ostringstream out;
  ProgressPrinter printer(1'700'000'000'000, out);
  // 1 of 6 units in 10 s: ~50 s left.
  printer.Add(Event(v1::Job::PROFILING, 1, 0, 10, "profile batch 16"));
  // Raw: 2 of 6 in 40 s: 80 s; the last estimate counted down: 20 s.
  printer.Add(Event(v1::Job::PROFILING, 2, 0, 40, "plan"));
  // Raw: 3 of 6 in 70 s: 70 s; 20 s counted down by 30 s: ran out.
  printer.Add(Event(v1::Job::VALIDATING, 2, 1, 70, "validate batch 8"));
  // A fresh estimate: 4 of 6 in 80 s: 40 s.
  printer.Add(Event(v1::Job::VALIDATING, 2, 2, 80, "validate batch 16"));
  const std::vector<std::string> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 4u) << out.str();
  EXPECT_THAT(lines[0], HasSubstr("~50s left"));
  EXPECT_THAT(lines[1], HasSubstr("~20s left"));
  EXPECT_THAT(lines[2], HasSubstr("longer than estimated"));
  EXPECT_THAT(lines[3], HasSubstr("~40s left"));
}

}  // namespace progress_printer

}  // namespace
}  // namespace mutwo
