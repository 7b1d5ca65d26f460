#include "server/job_settling.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/closed_loop.h"
#include "server/job_rules.h"
#include "server/max_batch_check.h"

namespace mutwo {
namespace {

bool Pending(const v1::Task& t) {
  return t.state() == v1::Task::QUEUED || t.state() == v1::Task::LEASED;
}

bool Stopped(const v1::Task& t) {
  return t.state() == v1::Task::FAILED || t.state() == v1::Task::CANCELLED;
}

// What the job's tasks say about its state.
struct TaskCounts {
  int pending_profile = 0;
  int pending_other = 0;
  int started = 0;
  int finished = 0;
  int profiles_failed = 0;
  int profiles_total = 0;
  std::string first_error;
};

TaskCounts CountTasks(const std::vector<v1::Task>& tasks) {
  TaskCounts c;
  for (const v1::Task& t : tasks) {
    const bool pending = Pending(t);
    if (t.kind() == v1::Task::PROFILE) {
      ++c.profiles_total;
      if (pending) ++c.pending_profile;
      if (t.state() == v1::Task::FAILED) ++c.profiles_failed;
    } else if (pending) {
      ++c.pending_other;
    }
    if (!pending) ++c.finished;
    if (t.state() != v1::Task::QUEUED || t.attempt() > 1) ++c.started;
    // A max batch step that failed says so in its check; the job's results
    // stand.
    if (t.state() == v1::Task::FAILED && c.first_error.empty() &&
        t.kind() != v1::Task::MAX_BATCH) {
      c.first_error = absl::StrCat(v1::Task::Kind_Name(t.kind()), " batch ",
                                   t.batch_size(), ": ", t.last_error());
    }
  }
  return c;
}

// A max batch step that will never report ends its check.
void EndStoppedMaxBatchChecks(v1::Job& j, const std::vector<v1::Task>& tasks) {
  for (const v1::Task& t : tasks) {
    if (t.kind() != v1::Task::MAX_BATCH || !Stopped(t)) continue;
    v1::MaxBatchCheck* c = CheckForTask(*j.mutable_max_batch(), t);
    if (c == nullptr) continue;
    c->set_state(v1::MaxBatchCheck::FAILED);
    c->set_reason(t.state() == v1::Task::FAILED
                      ? absl::StrCat("the step at batch ", t.batch_size(),
                                     " failed: ", t.last_error())
                      : "the job was cancelled before the step ran");
  }
}

// A round that will never report ends its budget's loop.
void EndStoppedValidations(v1::Job& j, const std::vector<v1::Task>& tasks) {
  for (const v1::Task& t : tasks) {
    if (t.kind() != v1::Task::VALIDATE || !Stopped(t)) continue;
    v1::BudgetOutcome* o =
        FindOutcome(*FindOrAddResult(j, t.batch_size()), t.schedule().budget());
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
}

// The state of an unfinished job from its task counts.
void DecideState(v1::Job& j, const TaskCounts& c) {
  if (c.pending_profile > 0) {
    j.set_state(c.started > 0 ? v1::Job::PROFILING : v1::Job::QUEUED);
  } else if (c.pending_other > 0) {
    j.set_state(v1::Job::VALIDATING);
  } else if (c.profiles_total > 0 && c.profiles_failed == c.profiles_total) {
    j.set_state(v1::Job::FAILED);
    j.set_error(c.first_error);
  } else if (c.profiles_total == 0) {
    // No task was ever stored with it (a job of a server that created
    // jobs and tasks in separate transactions and died between them):
    // nothing will run it.
    j.set_state(v1::Job::FAILED);
    j.set_error(
        "the job has no tasks (its submit was interrupted); "
        "submit it again");
  } else {
    j.set_state(v1::Job::SUCCEEDED);
    if (!c.first_error.empty()) j.set_error(c.first_error);
  }
}

}  // namespace

absl::StatusOr<v1::Job> SettleJobIn(storage::Store::Writer& w,
                                    const std::string& job_id) {
  MUTWO_ASSIGN_OR_RETURN(std::vector<v1::Task> tasks, w.ListTasks(job_id));
  const TaskCounts counts = CountTasks(tasks);
  return w.UpdateJob(job_id, [&](v1::Job& j) {
    j.set_tasks_total(static_cast<int32_t>(tasks.size()));
    j.set_tasks_done(counts.finished);
    EndStoppedMaxBatchChecks(j, tasks);
    EndStoppedValidations(j, tasks);
    if (!IsFinal(j.state())) DecideState(j, counts);
    return absl::OkStatus();
  });
}

}  // namespace mutwo
