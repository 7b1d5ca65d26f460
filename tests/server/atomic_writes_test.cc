// Submits, reports, failures and cancels are single transactions:
// fault injection in leveldb's `log_test` style. Every multi-step write of
// JobCore runs through Store::Write, whose fault hook names each step; for
// each step of each write the test
//   - fails that step (an error, as a full disk or a busy database would
//     give): the store must be exactly as before, and the retried write
//     must then succeed whole;
//   - kills the process there (SIGKILL, in a forked child that runs the
//     write): after reopening, the store must be exactly as before, and
//     again the retried write succeeds whole.
// "Exactly as before" compares every table a write touches (jobs, tasks,
// results, profiles, validations, the schedule cache), and every end state
// is checked for the invariants the kill -9 runs broke: no job without
// tasks, no DONE task without its result, no unfinished job with nothing
// left to run.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan_request.h"
#include "server/job_core.h"
#include "storage/sqlite.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kNowMs = 1'700'000'000'000;

// One data dir with its store and core; `hook` is the store's fault hook.
class Env {
 public:
  explicit Env(std::string dir) : dir_(std::move(dir)) {
    std::filesystem::remove_all(dir_);
  }
  ~Env() {
    Close();
    std::filesystem::remove_all(dir_);
  }

  void Open(std::function<absl::Status(absl::string_view)> hook = nullptr,
            int max_concurrent_jobs = 0) {
    storage::Store::Options so;
    so.data_dir = dir_;
    so.now_ms = [this] { return now_ms_.load(); };
    so.fault_hook = std::move(hook);
    auto store = storage::Store::Open(so);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    JobCore::Options o;
    o.lease_timeout_ms = 1000;
    o.max_attempts = 2;
    o.max_model_bytes = 1 << 20;
    o.max_concurrent_jobs = max_concurrent_jobs;
    core_ = *JobCore::Create(o, store_.get(), &metrics_, PlannerPlanFn(5),
                             [](const std::vector<v1::Profile>& ps,
                                int64_t capacity, double overhead) {
                               return planner::PredictMaxBatchProto(
                                   ps, capacity, overhead);
                             });
  }
  void Close() {
    core_.reset();
    store_.reset();
  }

  // The model stored and a worker registered (what every scenario needs).
  void Seed() {
    const std::string model =
        testing::UncheckedModelArchive("bytes the core never loads");
    sha_ = Sha256Hex(model);
    ASSERT_TRUE(store_->PutModel(sha_, "chain", model.size(), model).ok());
    v1::RegisterWorkerRequest reg;
    reg.mutable_worker()->set_worker_id("w1");
    reg.mutable_worker()->mutable_device()->set_kind("cpu");
    reg.mutable_worker()->mutable_device()->set_name("cpu");
    ASSERT_TRUE(core_->RegisterWorker(reg).ok());
  }

  v1::SubmitJobRequest Request(std::vector<int64_t> batches,
                               std::vector<std::string> budgets) {
    v1::SubmitJobRequest r;
    auto* spec = r.mutable_spec();
    spec->set_model_sha256(sha_);
    spec->set_model_name("chain");
    *spec->add_inputs() = *ParseTensorSpec("x:float32[B,16]");
    for (int64_t b : batches) spec->add_batch_sizes(b);
    for (const auto& b : budgets) *spec->add_budgets() = *ParseBudget(b);
    r.set_client_request_id("request-1");
    return r;
  }

  v1::Task Lease(const std::string& worker = "w1") {
    v1::LeaseTaskRequest r;
    r.set_worker_id(worker);
    auto lease = core_->LeaseTask(r);
    EXPECT_TRUE(lease.ok()) << lease.status();
    EXPECT_TRUE(lease->has_task());
    return lease->task();
  }

  absl::Status ReportProfile(const v1::Task& task) {
    v1::ReportProfileRequest r;
    r.set_worker_id("w1");
    r.set_task_id(task.task_id());
    r.set_fence_token(task.fence_token());
    *r.mutable_profile() = testing::ChainProfile(task.batch_size());
    return core_->ReportProfile(r);
  }

  absl::Status ReportValidation(const v1::Task& task, double peak_factor) {
    v1::ReportValidationRequest r;
    r.set_worker_id("w1");
    r.set_task_id(task.task_id());
    r.set_fence_token(task.fence_token());
    auto* v = r.mutable_validation();
    const int64_t peak = static_cast<int64_t>(
        peak_factor * static_cast<double>(task.schedule().budget_bytes()));
    v->set_budget_bytes(task.schedule().budget_bytes());
    v->mutable_scheduled()->set_peak_bytes(peak);
    v->mutable_predicted()->set_peak_bytes(
        task.schedule().predicted_peak_bytes());
    v->set_within_budget(peak <= task.schedule().budget_bytes());
    v->set_gradients_match(true);
    v->set_batchnorm_stats_match(true);
    return core_->ReportValidation(r);
  }

  // Every row of the tables a write touches, as text. Jobs are compared by
  // their stored proto without the fields a write may change before its
  // transaction (ReportProfile shows PLANNING while it plans) or that only
  // count changes.
  std::string Snapshot() {
    auto db = storage::Db::Open(dir_ + "/mutwo.db", 5000);
    EXPECT_TRUE(db.ok()) << db.status();
    std::string out;
    auto dump = [&](const std::string& sql) {
      auto stmt = (*db)->Prepare(sql);
      EXPECT_TRUE(stmt.ok()) << stmt.status();
      absl::StrAppend(&out, sql, "\n");
      while ((*stmt)->Step().value_or(false)) {
        for (int c = 0; c < (*stmt)->ColumnCount(); ++c) {
          absl::StrAppend(&out, absl::BytesToHexString((*stmt)->ColumnBlob(c)),
                          "|");
        }
        absl::StrAppend(&out, "\n");
      }
    };
    {
      auto stmt = (*db)->Prepare("SELECT job FROM jobs ORDER BY seq");
      while ((*stmt)->Step().value_or(false)) {
        v1::Job job;
        EXPECT_TRUE(job.ParseFromString((*stmt)->ColumnBlob(0)));
        job.clear_version();
        job.clear_updated_unix_ms();
        if (job.state() == v1::Job::PLANNING) job.set_state(v1::Job::PROFILING);
        absl::StrAppend(&out, job.ShortDebugString(), "\n");
      }
    }
    dump("SELECT * FROM tasks ORDER BY seq");
    dump("SELECT * FROM task_results ORDER BY task_id");
    dump("SELECT * FROM profiles ORDER BY job_id, batch_size");
    dump("SELECT * FROM validations ORDER BY rowid");
    dump("SELECT * FROM schedules ORDER BY cache_key");
    return out;
  }

  // What a kill -9 must never leave behind.
  void CheckInvariants() {
    auto db = storage::Db::Open(dir_ + "/mutwo.db", 5000);
    ASSERT_TRUE(db.ok());
    auto count = [&](const std::string& sql) {
      auto n = (*db)->QueryInt(sql);
      EXPECT_TRUE(n.ok()) << n.status();
      return n.value_or(-1);
    };
    EXPECT_EQ(count("SELECT COUNT(*) FROM jobs j WHERE NOT EXISTS "
                    "(SELECT 1 FROM tasks t WHERE t.job_id = j.job_id)"),
              0)
        << "a job without tasks";
    EXPECT_EQ(
        count(absl::StrCat(
            "SELECT COUNT(*) FROM tasks t WHERE t.state = ", v1::Task::DONE,
            " AND NOT EXISTS (SELECT 1 FROM task_results r "
            "WHERE r.task_id = t.task_id)")),
        0)
        << "a DONE task without its result";
    EXPECT_EQ(count(absl::StrCat(
                  "SELECT COUNT(*) FROM tasks t WHERE t.state = ",
                  v1::Task::DONE, " AND t.kind = ", v1::Task::PROFILE,
                  " AND NOT EXISTS (SELECT 1 FROM profiles p WHERE "
                  "p.job_id = t.job_id AND p.batch_size = t.batch_size)")),
              0)
        << "a DONE PROFILE task without its profile";
    EXPECT_EQ(
        count(absl::StrCat("SELECT COUNT(*) FROM jobs j WHERE j.state IN (",
                           v1::Job::QUEUED, ",", v1::Job::PROFILING, ",",
                           v1::Job::PLANNING, ",", v1::Job::VALIDATING,
                           ") AND NOT EXISTS (SELECT 1 FROM tasks t WHERE "
                           "t.job_id = j.job_id AND t.state IN (",
                           v1::Task::QUEUED, ",", v1::Task::LEASED, "))")),
        0)
        << "an unfinished job with nothing left to run";
  }

  const std::string dir_;
  std::atomic<int64_t> now_ms_{kNowMs};
  ServerMetrics metrics_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<JobCore> core_;
  std::string sha_;
  // What a scenario's prepare leaves for its write.
  std::string job_id_;
  v1::Task task_;
};

struct Scenario {
  std::string name;
  std::function<void(Env&)> prepare;
  std::function<absl::Status(Env&)> write;
  // The end state once the write succeeded (after a retry).
  std::function<void(Env&)> check;
};

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> out;
  out.push_back(
      {"SubmitJob", [](Env&) {},
       [](Env& env) {
         return env.core_->SubmitJob(env.Request({2, 4}, {"60%"})).status();
       },
       [](Env& env) {
         auto again = env.core_->SubmitJob(env.Request({2, 4}, {"60%"}));
         ASSERT_TRUE(again.ok()) << again.status();
         EXPECT_TRUE(again->deduplicated());
         EXPECT_EQ(again->job().tasks_total(), 2);
         EXPECT_EQ(env.store_->ListTasks(again->job().job_id())->size(), 2u);
       }});
  out.push_back(
      {"ReportProfile",
       [](Env& env) {
         env.job_id_ = env.core_->SubmitJob(env.Request({2}, {"60%", "80%"}))
                           ->job()
                           .job_id();
         env.task_ = env.Lease();
       },
       [](Env& env) { return env.ReportProfile(env.task_); },
       [](Env& env) {
         EXPECT_EQ(env.store_->GetTask(env.task_.task_id())->state(),
                   v1::Task::DONE);
         EXPECT_TRUE(env.store_->GetProfile(env.job_id_, 2).ok());
         const v1::Job job = *env.core_->GetJob(env.job_id_);
         EXPECT_EQ(job.state(), v1::Job::VALIDATING);
         ASSERT_EQ(job.results_size(), 1);
         EXPECT_EQ(job.results(0).schedules_size(), 2);
         EXPECT_EQ(job.tasks_total(), 3);  // the profile + 2 validations
       }});
  auto validating = [](Env& env) {
    env.job_id_ =
        env.core_->SubmitJob(env.Request({2}, {"80%"}))->job().job_id();
    ASSERT_TRUE(env.ReportProfile(env.Lease()).ok());
    env.task_ = env.Lease();
    ASSERT_EQ(env.task_.kind(), v1::Task::VALIDATE);
  };
  out.push_back(
      {"ReportValidationFits", validating,
       [](Env& env) { return env.ReportValidation(env.task_, 0.9); },
       [](Env& env) {
         const v1::Job job = *env.core_->GetJob(env.job_id_);
         EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
         EXPECT_EQ(job.results(0).outcomes(0).state(), v1::BudgetOutcome::FITS);
         EXPECT_EQ(env.store_->ListValidations(env.job_id_)->size(), 1u);
       }});
  out.push_back({"ReportValidationReplans", validating,
                 [](Env& env) { return env.ReportValidation(env.task_, 1.01); },
                 [](Env& env) {
                   const v1::Job job = *env.core_->GetJob(env.job_id_);
                   EXPECT_EQ(job.state(), v1::Job::VALIDATING);
                   EXPECT_EQ(job.results(0).outcomes(0).state(),
                             v1::BudgetOutcome::VALIDATING);
                   EXPECT_EQ(job.tasks_total(),
                             3);  // round 2 queued with the report
                 }});
  out.push_back(
      {"FailTask",
       [](Env& env) {
         env.job_id_ =
             env.core_->SubmitJob(env.Request({2}, {"60%"}))->job().job_id();
         env.task_ = env.Lease();
       },
       [](Env& env) {
         v1::FailTaskRequest r;
         r.set_worker_id("w1");
         r.set_task_id(env.task_.task_id());
         r.set_fence_token(env.task_.fence_token());
         r.set_reason("not a TorchScript archive");
         r.set_retryable(false);
         return env.core_->FailTask(r);
       },
       [](Env& env) {
         const v1::Job job = *env.core_->GetJob(env.job_id_);
         EXPECT_EQ(job.state(), v1::Job::FAILED);
         EXPECT_THAT(job.error(), HasSubstr("not a TorchScript archive"));
       }});
  out.push_back(
      {"CancelJob",
       [](Env& env) {
         env.job_id_ =
             env.core_->SubmitJob(env.Request({2, 4}, {"60%"}))->job().job_id();
         env.task_ = env.Lease();
       },
       [](Env& env) { return env.core_->CancelJob(env.job_id_).status(); },
       [](Env& env) {
         EXPECT_EQ(env.core_->GetJob(env.job_id_)->state(), v1::Job::CANCELLED);
         // Kept: a range-for over `*ListTasks(...)` reads a destroyed
         // StatusOr (ASan: stack-use-after-scope).
         const auto tasks = env.store_->ListTasks(env.job_id_);
         ASSERT_TRUE(tasks.ok()) << tasks.status();
         for (const v1::Task& t : *tasks) {
           EXPECT_EQ(t.state(), v1::Task::CANCELLED);
         }
       }});
  return out;
}

std::string DirFor(const std::string& what) {
  return (std::filesystem::path(::testing::TempDir()) /
          absl::StrCat("atomic_", ::getpid(), "_", what))
      .string();
}

// The steps one write goes through, recorded on a dry run.
std::vector<std::string> StepsOf(const Scenario& scenario) {
  std::vector<std::string> steps;
  bool recording = false;
  Env env(DirFor(scenario.name + "_steps"));
  env.Open([&](absl::string_view step) {
    if (recording) steps.emplace_back(step);
    return absl::OkStatus();
  });
  env.Seed();
  scenario.prepare(env);
  recording = true;
  EXPECT_TRUE(scenario.write(env).ok()) << scenario.name;
  return steps;
}

TEST(AtomicWritesTest, EveryWriteHasSeveralStepsAndEndsWithCommit) {
  for (const Scenario& scenario : Scenarios()) {
    const std::vector<std::string> steps = StepsOf(scenario);
    ASSERT_GE(steps.size(), 2u) << scenario.name;
    EXPECT_EQ(steps.back(), "commit") << scenario.name;
  }
}

TEST(AtomicWritesTest, AFailedStepLeavesNothingAndTheRetrySucceedsWhole) {
  for (const Scenario& scenario : Scenarios()) {
    const size_t steps = StepsOf(scenario).size();
    for (size_t k = 0; k < steps; ++k) {
      SCOPED_TRACE(absl::StrCat(scenario.name, ", step ", k, " of ", steps));
      size_t seen = 0;
      bool armed = false;
      Env env(DirFor(absl::StrCat(scenario.name, "_fail_", k)));
      env.Open([&](absl::string_view step) -> absl::Status {
        if (armed && seen++ == k) {
          return absl::UnavailableError(
              absl::StrCat("injected failure at ", step));
        }
        return absl::OkStatus();
      });
      env.Seed();
      scenario.prepare(env);
      const std::string before = env.Snapshot();
      armed = true;
      const absl::Status failed = scenario.write(env);
      armed = false;
      EXPECT_THAT(failed.message(), HasSubstr("injected failure"));
      EXPECT_EQ(env.Snapshot(), before) << "half of the write was stored";
      env.CheckInvariants();
      const absl::Status retried = scenario.write(env);
      ASSERT_TRUE(retried.ok()) << retried;
      scenario.check(env);
      env.CheckInvariants();
    }
  }
}

TEST(AtomicWritesTest, AKillBetweenStepsLeavesNothingAndTheRetrySucceeds) {
  for (const Scenario& scenario : Scenarios()) {
    const size_t steps = StepsOf(scenario).size();
    for (size_t k = 0; k < steps; ++k) {
      SCOPED_TRACE(absl::StrCat(scenario.name, ", kill at step ", k));
      Env env(DirFor(absl::StrCat(scenario.name, "_kill_", k)));
      env.Open();
      env.Seed();
      scenario.prepare(env);
      env.Close();
      const std::string before = env.Snapshot();
      const pid_t child = ::fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        // The write in another process, killed -9 at step k.
        size_t seen = 0;
        env.Open([&](absl::string_view) {
          if (seen++ == k) ::raise(SIGKILL);
          return absl::OkStatus();
        });
        (void)scenario.write(env);
        ::_exit(3);  // step k never came: the test is wrong
      }
      int wstatus = 0;
      ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
      ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
          << "the child was not killed at step " << k << " (status " << wstatus
          << ")";
      EXPECT_EQ(env.Snapshot(), before) << "half of the write survived";
      env.CheckInvariants();
      env.Open();
      const absl::Status retried = scenario.write(env);
      ASSERT_TRUE(retried.ok()) << retried;
      scenario.check(env);
      env.CheckInvariants();
    }
  }
}

TEST(AtomicWritesTest, ResultAfterTheLeaseExpiredIsTakenUntilReleased) {
  Env env(DirFor("late"));
  env.Open();
  env.Seed();
  env.job_id_ =
      env.core_->SubmitJob(env.Request({2, 4}, {"60%"}))->job().job_id();
  const v1::Task first = env.Lease();
  const v1::Task second = env.Lease();
  // Both leases expire (the server was down, the worker finished anyway).
  env.now_ms_ += 5000;
  env.core_->Reap();
  ASSERT_EQ(env.store_->GetTask(first.task_id())->state(), v1::Task::QUEUED);
  ASSERT_EQ(env.store_->GetTask(second.task_id())->state(), v1::Task::QUEUED);
  // Nobody took `first` since: its result is taken.
  ASSERT_TRUE(env.ReportProfile(first).ok());
  EXPECT_EQ(env.store_->GetTask(first.task_id())->state(), v1::Task::DONE);
  EXPECT_TRUE(env.store_->GetProfile(env.job_id_, first.batch_size()).ok());
  // `second` was leased again (a new fence): the old result is refused and
  // the new lease is untouched.
  const v1::Task again = env.Lease();
  ASSERT_EQ(again.task_id(), second.task_id());
  const absl::Status late = env.ReportProfile(second);
  EXPECT_TRUE(absl::IsFailedPrecondition(late)) << late;
  EXPECT_EQ(env.store_->GetTask(second.task_id())->state(), v1::Task::LEASED);
  EXPECT_TRUE(absl::IsNotFound(
      env.store_->GetProfile(env.job_id_, second.batch_size()).status()));
  ASSERT_TRUE(env.ReportProfile(again).ok());
}

TEST(AtomicWritesTest, ConcurrencyLimitHoldsUnderConcurrentSubmits) {
  constexpr int kLimit = 50;
  constexpr int kSubmits = 200;
  Env env(DirFor("limit"));
  env.Open(nullptr, kLimit);
  env.Seed();
  std::atomic<int> accepted{0}, exhausted{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSubmits; ++i) {
    threads.emplace_back([&, i] {
      v1::SubmitJobRequest r = env.Request({2}, {"60%"});
      r.set_client_request_id(absl::StrCat("submit-", i));
      const absl::Status s = env.core_->SubmitJob(r).status();
      if (s.ok()) {
        ++accepted;
      } else if (absl::IsResourceExhausted(s)) {
        ++exhausted;
      } else {
        ++other;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(accepted.load(), kLimit);
  EXPECT_EQ(exhausted.load(), kSubmits - kLimit);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(*env.store_->CountUnfinishedJobs(), kLimit);
  // A retried submit of an accepted job is answered even at the limit.
  v1::SubmitJobRequest retry = env.Request({2}, {"60%"});
  for (int i = 0; i < kSubmits; ++i) {
    retry.set_client_request_id(absl::StrCat("submit-", i));
    auto again = env.core_->SubmitJob(retry);
    if (again.ok()) {
      EXPECT_TRUE(again->deduplicated());
      return;
    }
  }
  ADD_FAILURE() << "no accepted submit could be retried";
}

// The first malformed report from the lease holder also gives its task
// back at once (queued for another attempt, naming the field: issue 29);
// nothing of any malformed profile is stored.
TEST(AtomicWritesTest, MalformedProfileIsRefusedNamingTheFieldNothingStored) {
  Env env(DirFor("malformed"));
  env.Open();
  env.Seed();
  env.job_id_ = env.core_->SubmitJob(env.Request({2}, {"60%"}))->job().job_id();
  const v1::Task task = env.Lease();
  std::string before;
  struct Case {
    std::string field;
    std::function<void(v1::Profile&)> spoil;
  };
  const std::vector<Case> cases = {
      {"activations[1] (value_id",
       [](v1::Profile& p) {
         p.mutable_activations(1)->set_producer_node(999);
       }},
      {".size_bytes",
       [](v1::Profile& p) {
         p.mutable_activations(0)->set_size_bytes(int64_t{1} << 60);
       }},
      {"nodes[3].id", [](v1::Profile& p) { p.mutable_nodes(3)->set_id(7); }},
      {"fixed.parameter_bytes",
       [](v1::Profile& p) { p.mutable_fixed()->set_parameter_bytes(-1); }},
      {"backward_steps[0].forward_node",
       [](v1::Profile& p) {
         p.mutable_backward_steps(0)->set_forward_node(12345);
       }},
      {"recompute_sources",
       [](v1::Profile& p) {
         p.mutable_activations(0)->add_recompute_sources(-5);
       }},
      {"nodes: the profile has no forward nodes",
       [](v1::Profile& p) { p.clear_nodes(); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    v1::ReportProfileRequest r;
    r.set_worker_id("w1");
    r.set_task_id(task.task_id());
    r.set_fence_token(task.fence_token());
    *r.mutable_profile() = testing::ChainProfile(2);
    c.spoil(*r.mutable_profile());
    const absl::Status s = env.core_->ReportProfile(r);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.field));
    EXPECT_TRUE(absl::IsNotFound(
        env.store_->GetProfile(env.job_id_, task.batch_size()).status()));
    if (before.empty()) {
      const v1::Task given_back = *env.store_->GetTask(task.task_id());
      EXPECT_EQ(given_back.state(), v1::Task::QUEUED);
      EXPECT_EQ(given_back.attempt(), 2);
      EXPECT_THAT(given_back.last_error(), HasSubstr(c.field));
      before = env.Snapshot();
    }
    EXPECT_EQ(env.Snapshot(), before) << "something of it was stored";
  }
  // The next attempt's honest profile is taken.
  const v1::Task again = env.Lease();
  EXPECT_EQ(again.task_id(), task.task_id());
  ASSERT_TRUE(env.ReportProfile(again).ok());
}

TEST(AtomicWritesTest, RestartSettlesAJobLeftWithoutTasks) {
  Env env(DirFor("recover"));
  env.Open();
  env.Seed();
  // What a server that stored jobs and tasks separately left after a kill.
  auto created = env.store_->CreateJob(env.Request({2}, {"60%"}).spec(),
                                       "old-request", "");
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(env.core_->RecoverUnfinishedJobs().ok());
  const v1::Job job = *env.core_->GetJob(created->job.job_id());
  EXPECT_EQ(job.state(), v1::Job::FAILED);
  EXPECT_THAT(job.error(), HasSubstr("no tasks"));
}

TEST(AtomicWritesTest, JobVersionGrowsWithEveryStoredChange) {
  Env env(DirFor("version"));
  env.Open();
  env.Seed();
  auto submitted = env.core_->SubmitJob(env.Request({2}, {"60%"}));
  ASSERT_TRUE(submitted.ok());
  const int64_t v0 = submitted->job().version();
  EXPECT_GT(v0, 0);
  const v1::Task task = env.Lease();  // QUEUED -> PROFILING
  const int64_t v1 = env.core_->GetJob(submitted->job().job_id())->version();
  EXPECT_GT(v1, v0);
  ASSERT_TRUE(env.ReportProfile(task).ok());
  EXPECT_GT(env.core_->GetJob(submitted->job().job_id())->version(), v1);
}

}  // namespace
}  // namespace mutwo
