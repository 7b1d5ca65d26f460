#include "server/job_progress.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"

namespace mutwo {
namespace {

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

bool Pending(const v1::Task& t) {
  return t.state() == v1::Task::QUEUED || t.state() == v1::Task::LEASED;
}

const v1::BatchResult* ResultFor(const v1::Job& job, int64_t batch) {
  for (const v1::BatchResult& r : job.results()) {
    if (r.batch_size() == batch) return &r;
  }
  return nullptr;
}

// Budgets of one batch size whose outcome is final. `profile_failed`: its
// PROFILE task failed or was cancelled, so no result will come (a DONE task
// without a result is being planned: nothing decided yet).
int DecidedBudgets(const v1::BatchResult* r, bool profile_failed, int budgets) {
  if (r == nullptr) return profile_failed ? budgets : 0;
  if (r->oom() || (!r->error().empty() && r->schedules().empty())) {
    return budgets;
  }
  int decided = 0;
  for (const v1::BudgetOutcome& o : r->outcomes()) {
    decided += o.state() != v1::BudgetOutcome::VALIDATING &&
               o.state() != v1::BudgetOutcome::STATE_UNSPECIFIED;
  }
  // Planning stopped at a budget (error): the rest will never be planned.
  if (!r->error().empty()) decided += budgets - r->outcomes_size();
  return std::min(decided, budgets);
}

std::string BudgetText(const v1::MemoryBudget& b) {
  return b.text().empty() ? FormatBudget(b) : b.text();
}

}  // namespace

v1::JobEvent JobEventFor(const v1::Job& job,
                         const std::vector<v1::Task>& tasks) {
  v1::JobEvent event;
  event.set_state(job.state());
  event.set_tasks_total(job.tasks_total());
  event.set_tasks_done(job.tasks_done());
  event.set_unix_ms(job.updated_unix_ms());
  event.set_waiting(job.waiting());
  const int budgets = job.spec().budgets_size();
  std::set<int64_t> batches(job.spec().batch_sizes().begin(),
                            job.spec().batch_sizes().end());
  std::set<int64_t> failed;
  for (const v1::Task& t : tasks) {
    if (t.kind() == v1::Task::PROFILE && !Pending(t) &&
        t.state() != v1::Task::DONE) {
      failed.insert(t.batch_size());
    }
  }
  // A batch size counts as profiled once its result (and so its plans) is
  // in the job, or its profile failed: profiled and decided move together.
  int decided = 0, profiled = 0;
  for (int64_t b : batches) {
    const v1::BatchResult* r = ResultFor(job, b);
    profiled += r != nullptr || failed.count(b) > 0;
    decided += DecidedBudgets(r, failed.count(b) > 0, budgets);
  }
  const int budgets_total = static_cast<int>(batches.size()) * budgets;
  if (IsFinal(job.state())) decided = budgets_total;
  event.set_batch_sizes_total(static_cast<int>(batches.size()));
  event.set_batch_sizes_profiled(profiled);
  event.set_budgets_total(budgets_total);
  event.set_budgets_decided(decided);

  // A task is leased a moment before its job leaves QUEUED: a queued job
  // runs nothing yet. The tasks are read before the job (job_watch.cc), so
  // a task that reported in between is still LEASED here beside the job it
  // finished: a final job runs nothing, and a VALIDATE whose budget is
  // decided already reported (not a next round).
  std::vector<const v1::Task*> leased;
  for (const v1::Task& t : tasks) {
    if (t.state() == v1::Task::LEASED && job.state() != v1::Job::QUEUED &&
        !IsFinal(job.state())) {
      leased.push_back(&t);
    }
  }
  std::sort(leased.begin(), leased.end(),
            [](const v1::Task* a, const v1::Task* b) {
              return std::make_pair(a->kind(), a->batch_size()) <
                     std::make_pair(b->kind(), b->batch_size());
            });
  std::vector<std::string> running;
  // The server plans a profile when it is reported: done, no result yet.
  if (!IsFinal(job.state())) {
    for (const v1::Task& t : tasks) {
      if (t.kind() == v1::Task::PROFILE && t.state() == v1::Task::DONE &&
          ResultFor(job, t.batch_size()) == nullptr) {
        running.push_back(absl::StrCat("plan batch ", t.batch_size()));
      }
    }
  }
  for (const v1::Task* t : leased) {
    if (t->kind() == v1::Task::PROFILE) {
      // The job shows PLANNING while a reported profile is planned, before
      // its task is marked DONE (server/profile_reports.cc, ShowPlanning:
      // only once no other profile is pending): that profile has run.
      const bool planned_now = job.state() == v1::Job::PLANNING &&
                               ResultFor(job, t->batch_size()) == nullptr;
      running.push_back(absl::StrCat(planned_now ? "plan" : "profile",
                                     " batch ", t->batch_size()));
      continue;
    }
    if (t->kind() == v1::Task::MAX_BATCH) {
      running.push_back(absl::StrCat("verify max batch ", t->batch_size(),
                                     t->schedule().policy() == v1::NONE
                                         ? " without checkpointing"
                                         : " with a schedule"));
      continue;
    }
    int round = 1;
    bool reported = false;
    if (const v1::BatchResult* r = ResultFor(job, t->batch_size())) {
      for (const v1::BudgetOutcome& o : r->outcomes()) {
        if (o.budget_bytes() == t->schedule().budget_bytes()) {
          round = o.rounds() + 1;
          reported = o.state() != v1::BudgetOutcome::VALIDATING &&
                     o.state() != v1::BudgetOutcome::STATE_UNSPECIFIED;
        }
      }
    }
    if (reported) continue;
    running.push_back(
        absl::StrCat("validate batch ", t->batch_size(), " budget ",
                     BudgetText(t->schedule().budget()),
                     round > 1 ? absl::StrCat(" (round ", round, ")") : ""));
  }
  event.set_running(absl::StrJoin(running, ", "));

  std::string message = absl::StrCat(
      v1::Job::State_Name(job.state()), ": profiled ",
      event.batch_sizes_profiled(), "/", event.batch_sizes_total(),
      " batch sizes, ", decided, "/", budgets_total, " budgets decided");
  if (!event.running().empty())
    absl::StrAppend(&message, "; running ", event.running());
  if (!job.waiting().empty())
    absl::StrAppend(&message, "; waiting: ", job.waiting());
  event.set_message(message);
  if (IsFinal(job.state())) *event.mutable_job() = job;
  return event;
}

bool ProgressChanged(const v1::JobEvent& a, const v1::JobEvent& b) {
  return a.state() != b.state() || a.waiting() != b.waiting() ||
         a.batch_sizes_profiled() != b.batch_sizes_profiled() ||
         a.budgets_decided() != b.budgets_decided() ||
         a.running() != b.running();
}

}  // namespace mutwo
