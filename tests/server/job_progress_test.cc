// WatchJob's progress on hand-built jobs and tasks: fixed denominators,
// what counts as decided, what runs, and which changes are news.
#include "server/job_progress.h"

#include "common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

v1::Job TwoBatchesTwoBudgets() {
  v1::Job job;
  job.set_job_id("job-1");
  job.set_state(v1::Job::PROFILING);
  job.mutable_spec()->add_batch_sizes(8);
  job.mutable_spec()->add_batch_sizes(16);
  *job.mutable_spec()->add_budgets() = *ParseBudget("60%");
  *job.mutable_spec()->add_budgets() = *ParseBudget("1B");
  return job;
}

v1::Task MakeTask(v1::Task::Kind kind, int64_t batch, v1::Task::State state,
                  const std::string& budget = "") {
  v1::Task t;
  t.set_kind(kind);
  t.set_batch_size(batch);
  t.set_state(state);
  if (!budget.empty()) {
    *t.mutable_schedule()->mutable_budget() = *ParseBudget(budget);
    t.mutable_schedule()->set_budget_bytes(1000);
  }
  return t;
}

v1::BudgetOutcome Outcome(v1::BudgetOutcome::State state, int rounds = 0) {
  v1::BudgetOutcome o;
  o.set_state(state);
  o.set_rounds(rounds);
  o.set_budget_bytes(1000);
  return o;
}

TEST(JobProgress, DenominatorsComeFromTheSpecNotTheTaskCount) {
  v1::Job job = TwoBatchesTwoBudgets();
  job.set_tasks_total(2);
  std::vector<v1::Task> tasks = {
      MakeTask(v1::Task::PROFILE, 8, v1::Task::DONE),
      MakeTask(v1::Task::PROFILE, 16, v1::Task::LEASED)};
  v1::BatchResult* r = job.add_results();
  r->set_batch_size(8);
  *r->add_outcomes() = Outcome(v1::BudgetOutcome::VALIDATING);
  *r->add_outcomes() = Outcome(v1::BudgetOutcome::INFEASIBLE);
  const v1::JobEvent before = JobEventFor(job, tasks);
  EXPECT_EQ(before.batch_sizes_total(), 2);
  EXPECT_EQ(before.batch_sizes_profiled(), 1);
  EXPECT_EQ(before.budgets_total(), 4);
  EXPECT_EQ(before.budgets_decided(), 1);  // 1B is infeasible: decided
  EXPECT_EQ(before.running(), "profile batch 16");
  EXPECT_EQ(before.message(),
            "PROFILING: profiled 1/2 batch sizes, 1/4 budgets decided; "
            "running profile batch 16");
  // A validation task queued: tasks_total grows, the denominators do not,
  // and that alone is no news for a watcher.
  job.set_tasks_total(3);
  job.set_updated_unix_ms(job.updated_unix_ms() + 5);
  tasks.push_back(MakeTask(v1::Task::VALIDATE, 8, v1::Task::QUEUED, "60%"));
  const v1::JobEvent after = JobEventFor(job, tasks);
  EXPECT_EQ(after.budgets_total(), 4);
  EXPECT_FALSE(ProgressChanged(before, after));
}

TEST(JobProgress, RunningNamesBatchBudgetAndRound) {
  v1::Job job = TwoBatchesTwoBudgets();
  job.set_state(v1::Job::VALIDATING);
  v1::BatchResult* r = job.add_results();
  r->set_batch_size(8);
  *r->add_outcomes() = Outcome(v1::BudgetOutcome::VALIDATING, 1);
  const v1::JobEvent e = JobEventFor(
      job, {MakeTask(v1::Task::VALIDATE, 8, v1::Task::LEASED, "60%"),
            MakeTask(v1::Task::PROFILE, 16, v1::Task::LEASED)});
  EXPECT_EQ(e.running(),
            "profile batch 16, validate batch 8 budget 60% (round 2)");
  v1::JobEvent other = e;
  other.set_running("profile batch 16");
  EXPECT_TRUE(ProgressChanged(e, other));
}

// Between a profile's report and its plans the task is DONE but the job has
// no result for it yet: nothing is decided (counting its budgets then made
// the count go 2/4 -> 1/4 in a watcher's lines).
TEST(JobProgress, AProfileBeingPlannedDecidesNothingYet) {
  v1::Job job = TwoBatchesTwoBudgets();
  const v1::JobEvent e =
      JobEventFor(job, {MakeTask(v1::Task::PROFILE, 8, v1::Task::DONE),
                        MakeTask(v1::Task::PROFILE, 16, v1::Task::QUEUED)});
  EXPECT_EQ(e.batch_sizes_profiled(), 0);
  EXPECT_EQ(e.budgets_decided(), 0);
  EXPECT_EQ(e.running(), "plan batch 8");
}

// While its report is planned the job is PLANNING and the profile's task is
// still LEASED: a watcher read `PLANNING ... running profile batch 32`.
TEST(JobProgress, APlanningJobIsNotProfilingItsReportedBatch) {
  v1::Job job = TwoBatchesTwoBudgets();
  job.set_state(v1::Job::PLANNING);
  v1::BatchResult* r = job.add_results();
  r->set_batch_size(8);
  const v1::JobEvent e =
      JobEventFor(job, {MakeTask(v1::Task::PROFILE, 8, v1::Task::DONE),
                        MakeTask(v1::Task::PROFILE, 16, v1::Task::LEASED)});
  EXPECT_EQ(e.running(), "plan batch 16");
  EXPECT_EQ(e.message(),
            "PLANNING: profiled 1/2 batch sizes, 0/4 budgets decided; "
            "running plan batch 16");
}

// WatchJob reads the tasks, then the job: the last VALIDATE can report in
// between, and CI read `SUCCEEDED ... running validate batch 8 budget 60%
// (round 2)`, a round that never ran.
TEST(JobProgress, AValidationThatReportedBetweenTheReadsIsNotRunning) {
  v1::Job job = TwoBatchesTwoBudgets();
  v1::BatchResult* r = job.add_results();
  r->set_batch_size(8);
  *r->add_outcomes() = Outcome(v1::BudgetOutcome::FITS, 1);
  const std::vector<v1::Task> tasks = {
      MakeTask(v1::Task::PROFILE, 8, v1::Task::DONE),
      MakeTask(v1::Task::VALIDATE, 8, v1::Task::LEASED, "60%")};
  for (v1::Job::State s : {v1::Job::VALIDATING, v1::Job::SUCCEEDED}) {
    job.set_state(s);
    EXPECT_EQ(JobEventFor(job, tasks).running(), "") << v1::Job::State_Name(s);
  }
  // Still validating (over budget, re-planned): the leased task is round 2.
  *r->mutable_outcomes(0) = Outcome(v1::BudgetOutcome::VALIDATING, 1);
  job.set_state(v1::Job::VALIDATING);
  EXPECT_EQ(JobEventFor(job, tasks).running(),
            "validate batch 8 budget 60% (round 2)");
}

TEST(JobProgress, AQueuedJobRunsNothingYet) {
  v1::Job job = TwoBatchesTwoBudgets();
  job.set_state(v1::Job::QUEUED);
  EXPECT_EQ(JobEventFor(job, {MakeTask(v1::Task::PROFILE, 8, v1::Task::LEASED)})
                .running(),
            "");
}

TEST(JobProgress, BatchSizesThatCannotBeProfiledDecideAllTheirBudgets) {
  v1::Job job = TwoBatchesTwoBudgets();
  v1::BatchResult* oom = job.add_results();
  oom->set_batch_size(16);
  oom->set_oom(true);
  // Batch 8's profile failed: no result, its task ended.
  const v1::JobEvent e =
      JobEventFor(job, {MakeTask(v1::Task::PROFILE, 8, v1::Task::FAILED),
                        MakeTask(v1::Task::PROFILE, 16, v1::Task::DONE)});
  EXPECT_EQ(e.batch_sizes_profiled(), 2);
  EXPECT_EQ(e.budgets_decided(), 4);
}

TEST(JobProgress, FinalJobIsAttachedAndComplete) {
  v1::Job job = TwoBatchesTwoBudgets();
  job.set_state(v1::Job::CANCELLED);
  const v1::JobEvent e = JobEventFor(job, {});
  EXPECT_TRUE(e.has_job());
  EXPECT_EQ(e.budgets_decided(), e.budgets_total());
  job.set_state(v1::Job::VALIDATING);
  EXPECT_FALSE(JobEventFor(job, {}).has_job());
}

}  // namespace
}  // namespace mutwo
