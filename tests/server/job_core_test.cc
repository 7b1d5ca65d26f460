// JobCore against a real Store (temp dir, injected clock) and the real
// planner: the job state machine, leases, fencing, re-queueing, dead letters,
// cancellation, the schedule cache, the closed loop of validations and upload
// verification.
#include "server/job_core.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/parse.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan_request.h"
#include "server/closed_loop.h"
#include "server/job_progress.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/synthetic_profile.h"
#include "tests/testing/training_loop_request.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

double CounterValue(ServerMetrics& metrics, const std::string& name,
                    const std::string& label_value) {
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      for (const auto& l : m.label) {
        if (l.value == label_value) return m.counter.value;
      }
    }
  }
  return -1;
}

double GaugeValue(ServerMetrics& metrics, const std::string& name,
                  const std::string& label_value) {
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      for (const auto& l : m.label) {
        if (l.value == label_value) return m.gauge.value;
      }
    }
  }
  return -1;
}

class JobCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("job_core_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    storage::Store::Options so;
    so.data_dir = dir_.string();
    so.now_ms = [this] { return now_ms_.load(); };
    store_ = *storage::Store::Open(so);
    JobCore::Options o;
    o.lease_timeout_ms = 1000;
    o.max_attempts = 2;
    o.max_model_bytes = 1 << 20;
    core_ = *JobCore::Create(o, store_.get(), &metrics_, PlannerPlanFn(20),
                             [](const std::vector<v1::Profile>& ps,
                                int64_t capacity, double overhead) {
                               return planner::PredictMaxBatchProto(
                                   ps, capacity, overhead);
                             });
    model_ = testing::UncheckedModelArchive(
        "not really torchscript, the core never loads it");
    sha_ = Sha256Hex(model_);
    ASSERT_TRUE(store_->PutModel(sha_, "chain", model_.size(), model_).ok());
    v1::RegisterWorkerRequest reg;
    reg.mutable_worker()->mutable_device()->set_kind("cpu");
    reg.mutable_worker()->mutable_device()->set_name("cpu");
    worker_ = core_->RegisterWorker(reg)->worker_id();
  }
  void TearDown() override {
    core_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
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
    return r;
  }

  v1::LeaseTaskResponse Lease() {
    v1::LeaseTaskRequest r;
    r.set_worker_id(worker_);
    r.set_wait_ms(0);
    return *core_->LeaseTask(r);
  }

  absl::Status ReportProfile(const v1::Task& task) {
    v1::ReportProfileRequest r;
    r.set_worker_id(worker_);
    r.set_task_id(task.task_id());
    r.set_fence_token(task.fence_token());
    *r.mutable_profile() = testing::ChainProfile(task.batch_size());
    return core_->ReportProfile(r);
  }

  // A worker's validation of `task` that measured `peak_bytes` (-1: the
  // schedule's prediction), as the executor fills it in.
  absl::Status ReportValidation(const v1::Task& task, int64_t peak_bytes = -1,
                                bool gradients_match = true) {
    v1::ReportValidationRequest r;
    r.set_worker_id(worker_);
    r.set_task_id(task.task_id());
    r.set_fence_token(task.fence_token());
    auto* v = r.mutable_validation();
    const int64_t peak =
        peak_bytes < 0 ? task.schedule().predicted_peak_bytes() : peak_bytes;
    v->set_budget_bytes(task.schedule().budget_bytes());
    v->mutable_scheduled()->set_peak_bytes(peak);
    v->mutable_predicted()->set_peak_bytes(
        task.schedule().predicted_peak_bytes());
    v->set_within_budget(peak <= task.schedule().budget_bytes());
    v->set_gradients_match(gradients_match);
    v->set_max_abs_grad_diff(gradients_match ? 0 : 0.25);
    v->set_batchnorm_stats_match(true);
    return core_->ReportValidation(r);
  }

  // Submits one batch size and budget, reports its profile and leases the
  // first VALIDATE task.
  v1::Task StartValidating(const std::string& budget, std::string* job_id) {
    auto submitted = core_->SubmitJob(Request({2}, {budget}));
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    *job_id = submitted->job().job_id();
    EXPECT_TRUE(ReportProfile(Lease().task()).ok());
    auto lease = Lease();
    EXPECT_TRUE(lease.has_task());
    EXPECT_EQ(lease.task().kind(), v1::Task::VALIDATE);
    return lease.task();
  }

  const v1::BudgetOutcome& Outcome(const v1::Job& job) {
    EXPECT_EQ(job.results_size(), 1);
    EXPECT_EQ(job.results(0).outcomes_size(), 1);
    return job.results(0).outcomes(0);
  }

  absl::StatusOr<v1::Schedule> CachedSchedule(const std::string& job_id,
                                              const std::string& budget) {
    v1::GetScheduleRequest r;
    r.set_job_id(job_id);
    r.set_batch_size(2);
    *r.mutable_budget() = *ParseBudget(budget);
    return core_->GetSchedule(r);
  }

  std::filesystem::path dir_;
  std::atomic<int64_t> now_ms_{1'700'000'000'000};
  ServerMetrics metrics_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<JobCore> core_;
  std::string model_, sha_, worker_;
};

// Issue 16: every job answers the memory question, budgets or not: per
// batch size the floor, the Pareto curve and its knee, and the max batch.
TEST_F(JobCoreTest, AJobWithoutBudgetsAnswersTheMemoryQuestion) {
  auto submitted = core_->SubmitJob(Request({2, 4}, {}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().job_id();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(ReportProfile(Lease().task()).ok());
  const v1::Job job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  ASSERT_EQ(job.results_size(), 2);
  for (const v1::BatchResult& r : job.results()) {
    SCOPED_TRACE(r.batch_size());
    EXPECT_EQ(r.schedules_size(), 0);
    EXPECT_GT(r.floor_bytes(), 0);
    EXPECT_LT(r.floor_bytes(), r.baseline_peak_bytes());
    ASSERT_GE(r.pareto_size(), 2);
    // The knee (the plan at the `auto` budget, averaged over the curve's
    // best points) lies on the curve's span: a budget between the floor and
    // the baseline, a plan within it, no lower than the curve's lowest
    // peak.
    EXPECT_GE(r.knee().budget_bytes(), r.floor_bytes());
    EXPECT_LE(r.knee().budget_bytes(), r.baseline_peak_bytes());
    EXPECT_LE(r.knee().predicted_peak_bytes(), r.knee().budget_bytes());
    EXPECT_GE(r.knee().predicted_peak_bytes(),
              r.pareto(0).predicted_peak_bytes());
  }
  // On the CPU without a capacity the max batch is predicted, not run.
  ASSERT_TRUE(job.has_max_batch());
  EXPECT_GT(job.max_batch().max_batch_without_checkpointing(), 0);
  EXPECT_EQ(job.max_batch().without_checkpointing_check().state(),
            v1::MaxBatchCheck::NOT_VERIFIED);
  EXPECT_THAT(job.max_batch().without_checkpointing_check().reason(),
              HasSubstr("--capacity"));
  // `auto` is served from the cache the job filled.
  v1::GetScheduleRequest get;
  get.set_job_id(id);
  get.set_batch_size(4);
  *get.mutable_budget() = *ParseBudget("auto");
  auto at_knee = core_->GetSchedule(get);
  ASSERT_TRUE(at_knee.ok()) << at_knee.status();
  EXPECT_EQ(at_knee->budget_bytes(), job.results(1).knee().budget_bytes());
  EXPECT_TRUE(at_knee->feasible());
}

// `auto` as a requested budget: resolved to the knee's bytes and validated
// like any budget.
TEST_F(JobCoreTest, AutoBudgetIsValidatedAtTheKnee) {
  std::string id;
  const v1::Task first = StartValidating("auto", &id);
  v1::Job job = *core_->GetJob(id);
  const v1::BatchResult r = job.results(0);
  ASSERT_EQ(r.schedules_size(), 1);
  EXPECT_TRUE(r.schedules(0).budget().knee());
  EXPECT_EQ(r.schedules(0).budget_bytes(), r.knee().budget_bytes());
  EXPECT_EQ(first.schedule().budget_bytes(), r.knee().budget_bytes());
  EXPECT_TRUE(first.schedule().feasible());
  EXPECT_LE(first.schedule().predicted_peak_bytes(),
            first.schedule().budget_bytes());
  ASSERT_TRUE(ReportValidation(first).ok());
  job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(Outcome(job).state(), v1::BudgetOutcome::FITS);
  EXPECT_EQ(Outcome(job).budget_bytes(), r.knee().budget_bytes());
}

// Issue 25: `floor` is validated like any budget. A worker's peak over the
// predicted floor becomes the floor the job shows, marked measured; nothing
// is planned lower, and the schedule fits the measured floor.
TEST_F(JobCoreTest, FloorBudgetIsMeasuredAndTheMeasuredFloorIsShown) {
  std::string id;
  const v1::Task first = StartValidating("floor", &id);
  v1::Job job = *core_->GetJob(id);
  const int64_t predicted = job.results(0).floor_bytes();
  EXPECT_EQ(job.results(0).measured_floor_bytes(), 0);
  EXPECT_TRUE(first.schedule().budget().floor());
  EXPECT_EQ(first.schedule().budget_bytes(), predicted);
  const int64_t measured = predicted + (64 << 10);
  ASSERT_TRUE(ReportValidation(first, measured).ok());
  EXPECT_FALSE(Lease().has_task());  // never re-planned below the floor
  job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  const v1::BudgetOutcome& o = Outcome(job);
  EXPECT_EQ(o.state(), v1::BudgetOutcome::FITS);
  // Proved for the peak plus the margin for its run-to-run jitter: a run
  // in another process that peaks 0.05% higher still fits.
  const int64_t proved = MeasuredFloorBytes(measured);
  EXPECT_GE(proved, measured + measured / 400);
  EXPECT_EQ(o.budget_bytes(), proved);
  EXPECT_EQ(o.measured_peak_bytes(), measured);
  EXPECT_THAT(o.reason(), HasSubstr("the floor measured"));
  EXPECT_EQ(job.results(0).measured_floor_bytes(), proved);
  EXPECT_EQ(job.results(0).floor_bytes(), predicted);
  EXPECT_TRUE(job.results(0).schedules(0).feasible());
  EXPECT_EQ(job.results(0).schedules(0).budget_bytes(), proved);
  // The next job is served the measured floor and validates it again.
  auto cached = CachedSchedule(id, "floor");
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_TRUE(cached->feasible());
  EXPECT_EQ(cached->budget_bytes(), proved);

  // Measured within its prediction: the predicted floor stands, proved.
  std::string id2;
  const v1::Task again = StartValidating("floor", &id2);
  ASSERT_TRUE(ReportValidation(again, predicted - 1).ok());
  job = *core_->GetJob(id2);
  EXPECT_EQ(Outcome(job).state(), v1::BudgetOutcome::FITS);
  EXPECT_EQ(job.results(0).measured_floor_bytes(),
            again.schedule().budget_bytes());
}

// Issue 26: a schedule measured in the user's training loop is reported,
// judged, stored with the job (which a later read returns) and exported as
// the model's training_loop gauge; a report of another graph changes
// nothing.
TEST_F(JobCoreTest, TrainingLoopReportsAreStoredBesideTheWorkersProof) {
  std::string id;
  const v1::Task first = StartValidating("80%", &id);
  ASSERT_TRUE(ReportValidation(first).ok());
  const v1::Schedule& s = first.schedule();
  v1::ReportTrainingLoopRequest request = testing::TrainingLoopRequest(
      id, s, s.budget_bytes() + 4096, v1::TrainingLoopValidation::COMPILE);
  v1::Validation& v = *request.mutable_report()->mutable_validation();
  auto over = core_->ReportTrainingLoop(request, "alice");
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_FALSE(over->report().holds());
  // Planned again below the budget by the loop's overshoot: lower, same
  // budget, the correction carried; the job's proved schedule untouched.
  ASSERT_TRUE(over->has_corrected()) << over->note();
  const v1::Schedule& corrected = over->corrected();
  EXPECT_EQ(corrected.budget_bytes(), s.budget_bytes());
  EXPECT_GE(corrected.correction_bytes(),
            s.budget_bytes() + 4096 - s.predicted_peak_bytes());
  EXPECT_LT(corrected.predicted_peak_bytes(), s.predicted_peak_bytes());
  EXPECT_THAT(over->note(), HasSubstr("run the corrected schedule"));
  EXPECT_EQ(core_->GetJob(id)->results(0).schedules(0).predicted_peak_bytes(),
            s.predicted_peak_bytes());
  EXPECT_THAT(over->report().problem(), HasSubstr("exceeds the budget"));
  EXPECT_EQ(over->report().reported_by(), "alice");
  EXPECT_EQ(over->report().reported_unix_ms(), now_ms_.load());
  EXPECT_FALSE(over->outcome().validated_in_training_loop());
  EXPECT_EQ(over->outcome().state(), v1::BudgetOutcome::FITS);

  v.mutable_scheduled()->set_peak_bytes(s.budget_bytes() - 4096);
  auto holds = core_->ReportTrainingLoop(request, "alice");
  ASSERT_TRUE(holds.ok()) << holds.status();
  EXPECT_TRUE(holds->report().holds());
  EXPECT_FALSE(holds->has_corrected());
  const v1::Job job = *core_->GetJob(id);
  const v1::BudgetOutcome& o = Outcome(job);
  EXPECT_TRUE(o.validated_in_training_loop());
  EXPECT_EQ(o.training_loop_peak_bytes(), s.budget_bytes() - 4096);
  EXPECT_EQ(o.training_loop_reports(), 2);
  ASSERT_EQ(job.results(0).training_loop_size(), 2);
  EXPECT_EQ(job.results(0).training_loop(1).path(),
            v1::TrainingLoopValidation::COMPILE);
  EXPECT_EQ(GaugeValue(metrics_, "mutwo_model_peak_bytes", "training_loop"),
            static_cast<double>(s.budget_bytes() - 4096));

  v.set_graph_fingerprint("another-model");
  auto refused = core_->ReportTrainingLoop(request, "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_->GetJob(id)->version(), job.version());
  request.set_job_id("no-such-job");
  EXPECT_EQ(core_->ReportTrainingLoop(request, "alice").status().code(),
            absl::StatusCode::kNotFound);
}

// Issue 16: the max batch is run on a worker before it is reported; a step
// over the capacity steps the batch size down, and the job reports the
// batch size measured to fit.
TEST_F(JobCoreTest, MaxBatchIsVerifiedByAStepAndSteppedDown) {
  v1::SubmitJobRequest request = Request({2, 4}, {});
  // Room for a few dozen samples of the synthetic chain.
  const int64_t capacity = testing::ChainProfile(4).measured().peak_bytes() * 8;
  request.mutable_spec()->mutable_capacity()->set_bytes(capacity);
  auto submitted = core_->SubmitJob(request);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().job_id();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(ReportProfile(Lease().task()).ok());
  v1::Job job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::VALIDATING);
  const v1::MaxBatchPrediction predicted = job.max_batch();
  EXPECT_EQ(predicted.capacity_bytes(), capacity);
  const int64_t without = predicted.max_batch_without_checkpointing();
  ASSERT_GT(without, 4);
  EXPECT_EQ(predicted.without_checkpointing_check().state(),
            v1::MaxBatchCheck::VERIFYING);
  // The first step without checkpointing measures 10% over the capacity;
  // every other step measures what was predicted.
  bool overshot = false;
  int steps = 0;
  for (auto lease = Lease(); lease.has_task(); lease = Lease()) {
    ASSERT_EQ(lease.task().kind(), v1::Task::MAX_BATCH);
    ++steps;
    const bool unmodified = lease.task().schedule().policy() == v1::NONE;
    if (unmodified) {
      EXPECT_TRUE(lease.task().schedule().decisions().empty() ||
                  lease.task().schedule().recomputed() == 0);
    }
    if (unmodified && !overshot) {
      EXPECT_EQ(lease.task().batch_size(), without);
      overshot = true;
      ASSERT_TRUE(ReportValidation(lease.task(), capacity * 11 / 10).ok());
      const v1::Job mid = *core_->GetJob(id);
      EXPECT_EQ(mid.state(), v1::Job::VALIDATING);
      EXPECT_THAT(mid.max_batch().without_checkpointing_check().reason(),
                  HasSubstr("stepped down"));
      continue;
    }
    EXPECT_LE(lease.task().schedule().predicted_peak_bytes(), capacity);
    ASSERT_TRUE(ReportValidation(lease.task()).ok());
  }
  EXPECT_TRUE(overshot);
  EXPECT_GE(steps, 2);
  job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  const v1::MaxBatchCheck& check =
      job.max_batch().without_checkpointing_check();
  EXPECT_EQ(check.state(), v1::MaxBatchCheck::VERIFIED);
  EXPECT_EQ(check.predicted_batch_size(), without);
  EXPECT_LT(check.batch_size(), without);
  EXPECT_EQ(check.rounds(), 2);
  // The reported answer is the verified one.
  EXPECT_EQ(job.max_batch().max_batch_without_checkpointing(),
            check.batch_size());
  // The chain's activations are most of its memory: a schedule lets a
  // larger batch fit (93 against 30 when written), checked by a step of its
  // own.
  EXPECT_GT(predicted.max_batch_with_schedule(), without);
  ASSERT_TRUE(job.max_batch().has_with_schedule_check());
  EXPECT_EQ(job.max_batch().with_schedule_check().state(),
            v1::MaxBatchCheck::VERIFIED);
  EXPECT_EQ(job.max_batch().max_batch_with_schedule(),
            job.max_batch().with_schedule_check().batch_size());
}

TEST_F(JobCoreTest, JobRunsThroughEveryStateToSucceeded) {
  auto submitted = core_->SubmitJob(Request({2, 4}, {"60%", "1B"}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().job_id();
  EXPECT_EQ(submitted->job().state(), v1::Job::QUEUED);
  EXPECT_EQ(submitted->job().tasks_total(), 2);

  for (int i = 0; i < 2; ++i) {
    auto lease = Lease();
    ASSERT_TRUE(lease.has_task());
    EXPECT_EQ(lease.task().kind(), v1::Task::PROFILE);
    EXPECT_EQ(lease.spec().model_sha256(), sha_);
    EXPECT_EQ(core_->GetJob(id)->state(), v1::Job::PROFILING);
    ASSERT_TRUE(ReportProfile(lease.task()).ok());
  }
  v1::Job job = *core_->GetJob(id);
  ASSERT_EQ(job.results_size(), 2);
  // 60% is feasible and gets a VALIDATE task; 1 byte is not.
  for (const auto& r : job.results()) {
    ASSERT_EQ(r.schedules_size(), 2);
    EXPECT_TRUE(r.schedules(0).feasible());
    EXPECT_LE(r.schedules(0).predicted_peak_bytes(),
              r.schedules(0).budget_bytes());
    EXPECT_FALSE(r.schedules(1).feasible());
    EXPECT_GT(r.schedules(1).floor_bytes(), 1);
  }
  EXPECT_TRUE(job.has_max_batch());
  EXPECT_EQ(job.state(), v1::Job::VALIDATING);
  EXPECT_EQ(job.tasks_total(), 4);
  for (int i = 0; i < 2; ++i) {
    auto lease = Lease();
    ASSERT_TRUE(lease.has_task());
    EXPECT_EQ(lease.task().kind(), v1::Task::VALIDATE);
    EXPECT_TRUE(lease.task().schedule().feasible());
    ASSERT_TRUE(ReportValidation(lease.task()).ok());
  }
  job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(job.tasks_done(), 4);
  EXPECT_EQ(job.results(0).validations_size(), 1);
  EXPECT_EQ(job.results(0).validations(0).round(), 1);
  EXPECT_FALSE(Lease().has_task());
  // Per budget: 60% measured within the budget in one round; 1 byte never
  // ran.
  for (const auto& r : job.results()) {
    ASSERT_EQ(r.outcomes_size(), 2);
    EXPECT_EQ(r.outcomes(0).state(), v1::BudgetOutcome::FITS);
    EXPECT_TRUE(r.outcomes(0).fits());
    EXPECT_EQ(r.outcomes(0).rounds(), 1);
    EXPECT_EQ(r.outcomes(0).reason(), "");
    EXPECT_EQ(r.outcomes(1).state(), v1::BudgetOutcome::INFEASIBLE);
    EXPECT_FALSE(r.outcomes(1).fits());
    EXPECT_EQ(r.outcomes(1).rounds(), 0);
    EXPECT_THAT(r.outcomes(1).reason(), HasSubstr("below the floor"));
  }
}

// What `submit --wait` and `watch` show: after every step the progress has
// the same denominators, the stage never goes back (no PROFILING after
// PLANNING or VALIDATING) and the decided budgets only grow.
TEST_F(JobCoreTest, ProgressIsMonotoneWithFixedDenominators) {
  auto submitted = core_->SubmitJob(Request({2, 4, 8}, {"60%", "1B"}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().job_id();
  std::vector<v1::JobEvent> events;
  auto observe = [&] {
    events.push_back(JobEventFor(*core_->GetJob(id), *core_->ListTasks(id)));
  };
  observe();
  for (int i = 0; i < 20; ++i) {
    auto lease = Lease();
    if (!lease.has_task()) break;
    observe();
    if (lease.task().kind() == v1::Task::PROFILE) {
      ASSERT_TRUE(ReportProfile(lease.task()).ok());
    } else {
      ASSERT_TRUE(ReportValidation(lease.task()).ok());
    }
    observe();
  }
  ASSERT_EQ(events.back().state(), v1::Job::SUCCEEDED);
  auto rank = [](v1::Job::State s) { return static_cast<int>(s); };
  for (size_t i = 1; i < events.size(); ++i) {
    SCOPED_TRACE(events[i].message());
    EXPECT_EQ(events[i].batch_sizes_total(), 3);
    EXPECT_EQ(events[i].budgets_total(), 6);
    EXPECT_GE(rank(events[i].state()), rank(events[i - 1].state()));
    EXPECT_GE(events[i].budgets_decided(), events[i - 1].budgets_decided());
    EXPECT_GE(events[i].batch_sizes_profiled(),
              events[i - 1].batch_sizes_profiled());
  }
  EXPECT_EQ(events.back().budgets_decided(), 6);
  // While batch 2 was profiled, it was named as running.
  EXPECT_EQ(events[1].running(), "profile batch 2");
}

// The closed loop: a round measured over the budget is planned again below
// the budget by the overshoot plus a margin, and the second round, within
// the budget, makes it fit.
TEST_F(JobCoreTest, OverBudgetValidationIsReplannedLowerAndFitsInRoundTwo) {
  std::string id;
  const v1::Task first = StartValidating("80%", &id);
  const v1::Schedule& s1 = first.schedule();
  ASSERT_TRUE(s1.feasible());
  EXPECT_EQ(s1.correction_bytes(), 0);
  EXPECT_EQ(Outcome(*core_->GetJob(id)).state(), v1::BudgetOutcome::VALIDATING);
  const int64_t budget = s1.budget_bytes();
  const int64_t measured = budget + (256 << 10);
  ASSERT_TRUE(ReportValidation(first, measured).ok());

  v1::Job job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::VALIDATING);
  const v1::BudgetOutcome& o1 = Outcome(job);
  EXPECT_EQ(o1.state(), v1::BudgetOutcome::VALIDATING);
  EXPECT_FALSE(o1.fits());
  EXPECT_EQ(o1.rounds(), 1);
  EXPECT_EQ(o1.measured_peak_bytes(), measured);
  // The overshoot over the prediction plus 1% of the budget.
  const int64_t correction =
      measured - s1.predicted_peak_bytes() + (budget + 99) / 100;
  EXPECT_EQ(o1.correction_bytes(), correction);
  ASSERT_EQ(job.results(0).validations_size(), 1);
  EXPECT_EQ(job.results(0).validations(0).round(), 1);

  // Round two runs the re-planned schedule: the same budget, planned lower.
  auto lease = Lease();
  ASSERT_TRUE(lease.has_task());
  EXPECT_EQ(lease.task().kind(), v1::Task::VALIDATE);
  const v1::Schedule& s2 = lease.task().schedule();
  EXPECT_TRUE(s2.feasible());
  EXPECT_EQ(s2.budget_bytes(), budget);
  EXPECT_EQ(s2.correction_bytes(), correction);
  EXPECT_LE(s2.predicted_peak_bytes(), budget - correction);
  EXPECT_LT(s2.predicted_peak_bytes(), s1.predicted_peak_bytes());
  EXPECT_EQ(job.results(0).schedules(0).correction_bytes(), correction);
  // Meanwhile the cache serves the corrected plan, not the one that
  // overshot.
  auto mid = CachedSchedule(id, "80%");
  ASSERT_TRUE(mid.ok()) << mid.status();
  EXPECT_EQ(mid->correction_bytes(), correction);
  EXPECT_EQ(mid->measured_peak_bytes(), 0);

  ASSERT_TRUE(ReportValidation(lease.task()).ok());
  job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  const v1::BudgetOutcome& o2 = Outcome(job);
  EXPECT_EQ(o2.state(), v1::BudgetOutcome::FITS);
  EXPECT_TRUE(o2.fits());
  EXPECT_EQ(o2.rounds(), 2);
  EXPECT_EQ(o2.measured_peak_bytes(), s2.predicted_peak_bytes());
  EXPECT_EQ(o2.reason(), "");
  ASSERT_EQ(job.results(0).validations_size(), 2);
  EXPECT_EQ(job.results(0).validations(1).round(), 2);
  EXPECT_EQ(store_->ListValidations(id)->size(), 2u);
  EXPECT_EQ(CounterValue(metrics_, "mutwo_validations_total", "over_budget"),
            1);
  EXPECT_EQ(CounterValue(metrics_, "mutwo_validations_total", "fits"), 1);
  // The cache keeps what it learned, with the measurement.
  auto cached = CachedSchedule(id, "80%");
  ASSERT_TRUE(cached.ok());
  EXPECT_TRUE(cached->feasible());
  EXPECT_EQ(cached->correction_bytes(), correction);
  EXPECT_EQ(cached->measured_peak_bytes(), s2.predicted_peak_bytes());
}

// Every round over the budget: after the last one it does not fit, with
// the reason, and the cache never serves that schedule as fitting again,
// to this job or to the next.
TEST_F(JobCoreTest,
       PersistentOvershootEndsNotFittingAndIsNeverServedAsFitting) {
  std::string id;
  v1::Task task = StartValidating("80%", &id);
  const int64_t budget = task.schedule().budget_bytes();
  int64_t previous_correction = -1;
  int64_t measured = 0;
  for (int round = 1; round <= 3; ++round) {
    ASSERT_EQ(task.kind(), v1::Task::VALIDATE) << round;
    EXPECT_GT(task.schedule().correction_bytes(), previous_correction);
    previous_correction = task.schedule().correction_bytes();
    measured = budget + (64 << 10);
    ASSERT_TRUE(ReportValidation(task, measured).ok());
    if (round < 3) {
      auto lease = Lease();
      ASSERT_TRUE(lease.has_task()) << "round " << round + 1;
      task = lease.task();
    }
  }
  EXPECT_FALSE(Lease().has_task());
  v1::Job job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  const v1::BudgetOutcome& o = Outcome(job);
  EXPECT_EQ(o.state(), v1::BudgetOutcome::OVER_BUDGET);
  EXPECT_FALSE(o.fits());
  EXPECT_EQ(o.rounds(), 3);
  EXPECT_EQ(o.reason(),
            absl::StrCat("measured ", FormatBytes(measured), " > budget ",
                         FormatBytes(budget), " after 3 rounds; floor ",
                         FormatBytes(task.schedule().floor_bytes())));
  EXPECT_EQ(job.results(0).validations_size(), 3);
  // The job result's schedule is the last one, marked with what it
  // measured.
  const v1::Schedule& shown = job.results(0).schedules(0);
  EXPECT_FALSE(shown.feasible());
  EXPECT_EQ(shown.measured_peak_bytes(), measured);
  EXPECT_EQ(CounterValue(metrics_, "mutwo_validations_total", "over_budget"),
            3);
  EXPECT_EQ(CounterValue(metrics_, "mutwo_validations_total", "fits"), 0);

  auto cached = CachedSchedule(id, "80%");
  ASSERT_TRUE(cached.ok());
  EXPECT_FALSE(cached->feasible());
  EXPECT_EQ(cached->measured_peak_bytes(), measured);
  EXPECT_THAT(cached->reason(), HasSubstr("after 3 rounds"));
  // A second job of the same model and spec hits that entry: not fitting at
  // once, nothing to run.
  std::string second;
  auto submitted = core_->SubmitJob(Request({2}, {"80%"}));
  second = submitted->job().job_id();
  ASSERT_TRUE(ReportProfile(Lease().task()).ok());
  EXPECT_FALSE(Lease().has_task());
  job = *core_->GetJob(second);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(Outcome(job).state(), v1::BudgetOutcome::OVER_BUDGET);
  EXPECT_FALSE(Outcome(job).fits());
  EXPECT_EQ(Outcome(job).rounds(), 0);
  EXPECT_THAT(Outcome(job).reason(), HasSubstr("after 3 rounds"));
  EXPECT_FALSE(job.results(0).schedules(0).feasible());
}

// An overshoot so large that the budget less the correction is below the
// planner's floor ends the loop at once.
TEST_F(JobCoreTest, CorrectionBelowTheFloorEndsNotFitting) {
  std::string id;
  const v1::Task task = StartValidating("80%", &id);
  const int64_t budget = task.schedule().budget_bytes();
  ASSERT_TRUE(ReportValidation(task, 2 * budget).ok());
  EXPECT_FALSE(Lease().has_task());
  const v1::Job job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  const v1::BudgetOutcome& o = Outcome(job);
  EXPECT_EQ(o.state(), v1::BudgetOutcome::OVER_BUDGET);
  EXPECT_EQ(o.rounds(), 1);
  EXPECT_THAT(
      o.reason(),
      HasSubstr(absl::StrCat("measured ", FormatBytes(2 * budget), " > budget ",
                             FormatBytes(budget), " after 1 round")));
  EXPECT_THAT(o.reason(), HasSubstr("no schedule is predicted to fit"));
  EXPECT_THAT(o.reason(), HasSubstr("floor"));
  auto cached = CachedSchedule(id, "80%");
  ASSERT_TRUE(cached.ok());
  EXPECT_FALSE(cached->feasible());
}

// Gradients that differ fail the budget whatever the peak: not a fit, not
// re-planned.
TEST_F(JobCoreTest, ValidationWithDifferentGradientsFailsAndDoesNotFit) {
  std::string id;
  const v1::Task task = StartValidating("80%", &id);
  ASSERT_TRUE(ReportValidation(task, -1, /*gradients_match=*/false).ok());
  EXPECT_FALSE(Lease().has_task());
  const v1::Job job = *core_->GetJob(id);
  const v1::BudgetOutcome& o = Outcome(job);
  EXPECT_EQ(o.state(), v1::BudgetOutcome::FAILED);
  EXPECT_FALSE(o.fits());
  EXPECT_EQ(o.rounds(), 1);
  EXPECT_THAT(o.reason(), HasSubstr("gradients (max |diff| 0.25) differ"));
  EXPECT_EQ(CounterValue(metrics_, "mutwo_validations_total", "failed"), 1);
}

// A VALIDATE task that dead-letters ends its budget's loop as failed.
TEST_F(JobCoreTest, FailedValidateTaskFailsTheOutcome) {
  std::string id;
  const v1::Task task = StartValidating("80%", &id);
  v1::FailTaskRequest fail;
  fail.set_worker_id(worker_);
  fail.set_task_id(task.task_id());
  fail.set_fence_token(task.fence_token());
  fail.set_reason("task process killed by signal 9");
  fail.set_retryable(false);
  ASSERT_TRUE(core_->FailTask(fail).ok());
  const v1::Job job = *core_->GetJob(id);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED);
  const v1::BudgetOutcome& o = Outcome(job);
  EXPECT_EQ(o.state(), v1::BudgetOutcome::FAILED);
  EXPECT_FALSE(o.fits());
  EXPECT_THAT(o.reason(), HasSubstr("killed by signal 9"));
}

TEST_F(JobCoreTest, RepeatedRequestIdReturnsTheFirstJob) {
  auto r = Request({2}, {"60%"});
  r.set_client_request_id("retry-me");
  auto first = core_->SubmitJob(r);
  auto second = core_->SubmitJob(r);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->job().job_id(), second->job().job_id());
  EXPECT_TRUE(second->deduplicated());
  EXPECT_EQ(store_->ListTasks(first->job().job_id())->size(), 1u);
}

TEST_F(JobCoreTest, ExpiredLeaseIsRequeuedAndTheLateReportIsRejected) {
  auto submitted = core_->SubmitJob(Request({2}, {"60%"}));
  auto first = Lease();
  ASSERT_TRUE(first.has_task());
  now_ms_ += 5000;  // past the 1 s lease without a heartbeat
  core_->Reap();
  auto second = Lease();
  ASSERT_TRUE(second.has_task());
  EXPECT_EQ(second.task().task_id(), first.task().task_id());
  EXPECT_EQ(second.task().attempt(), 2);
  EXPECT_GT(second.task().fence_token(), first.task().fence_token());
  // The first worker wakes up late: its heartbeat and report are refused.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(worker_);
  hb.set_task_id(first.task().task_id());
  hb.set_fence_token(first.task().fence_token());
  EXPECT_FALSE(core_->Heartbeat(hb)->lease_valid());
  EXPECT_EQ(ReportProfile(first.task()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ReportProfile(second.task()).ok());
  // A retried report of the same fence stores nothing twice.
  ASSERT_TRUE(ReportProfile(second.task()).ok());
  v1::Job job = *core_->GetJob(submitted->job().job_id());
  EXPECT_EQ(job.results_size(), 1);
  EXPECT_EQ(job.results(0).schedules_size(), 1);
}

// Issue 29: a report the server refuses fails its task at once with the
// refusal's reason: the task does not hang until its lease expires, and the
// job does not end naming the lease instead of the limit.
TEST_F(JobCoreTest, ProfileOverALimitFailsItsTaskAtOnceNamingTheLimit) {
  auto submitted = core_->SubmitJob(Request({2}, {"60%"}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::Task task = Lease().task();
  ASSERT_EQ(task.kind(), v1::Task::PROFILE);
  v1::ReportProfileRequest r;
  r.set_worker_id(worker_);
  r.set_task_id(task.task_id());
  *r.mutable_profile() = testing::ChainProfile(task.batch_size(), 16384);
  // From a lease the reporter does not hold: refused, the task untouched.
  r.set_fence_token(task.fence_token() + 1);
  EXPECT_TRUE(absl::IsResourceExhausted(core_->ReportProfile(r)));
  EXPECT_EQ(store_->GetTask(task.task_id())->state(), v1::Task::LEASED);
  // From the lease holder: refused, and the task failed now (no time
  // passes, no reaper runs).
  r.set_fence_token(task.fence_token());
  const absl::Status refused = core_->ReportProfile(r);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  const v1::Task after = *store_->GetTask(task.task_id());
  EXPECT_EQ(after.state(), v1::Task::FAILED);
  EXPECT_THAT(after.last_error(), HasSubstr("--max_profile_nodes"));
  const v1::Job job = *core_->GetJob(submitted->job().job_id());
  EXPECT_EQ(job.state(), v1::Job::FAILED);
  EXPECT_THAT(job.error(), HasSubstr("more than 8192"));
  EXPECT_THAT(job.error(), HasSubstr("--max_profile_nodes"));
  EXPECT_THAT(job.error(), ::testing::Not(HasSubstr("lease")));
  // The lease is gone with the task: a later report of it is refused.
  EXPECT_EQ(ReportProfile(task).code(), absl::StatusCode::kFailedPrecondition);
}

// A report of the wrong kind for the task may be one worker's fault: the
// task is queued again at once (another attempt), naming the refusal.
TEST_F(JobCoreTest, ReportOfTheWrongKindQueuesItsTaskAgainAtOnce) {
  auto submitted = core_->SubmitJob(Request({2}, {"60%"}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::Task task = Lease().task();
  ASSERT_EQ(task.kind(), v1::Task::PROFILE);
  const absl::Status refused = ReportValidation(task);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  const v1::Task after = *store_->GetTask(task.task_id());
  EXPECT_EQ(after.state(), v1::Task::QUEUED);
  EXPECT_EQ(after.attempt(), 2);
  EXPECT_THAT(after.last_error(),
              HasSubstr("is not a VALIDATE or MAX_BATCH task"));
  auto again = Lease();
  ASSERT_TRUE(again.has_task());
  EXPECT_EQ(again.task().task_id(), task.task_id());
  EXPECT_TRUE(ReportProfile(again.task()).ok());
}

TEST_F(JobCoreTest, BadModelFailsTheJobWithTheWorkersReason) {
  auto submitted = core_->SubmitJob(Request({2, 4}, {"60%"}));
  for (int i = 0; i < 2; ++i) {
    auto lease = Lease();
    ASSERT_TRUE(lease.has_task());
    v1::FailTaskRequest fail;
    fail.set_worker_id(worker_);
    fail.set_task_id(lease.task().task_id());
    fail.set_fence_token(lease.task().fence_token());
    fail.set_reason("model.pt: not a TorchScript archive (no zip header)");
    fail.set_retryable(false);
    ASSERT_TRUE(core_->FailTask(fail).ok());
  }
  v1::Job job = *core_->GetJob(submitted->job().job_id());
  EXPECT_EQ(job.state(), v1::Job::FAILED);
  EXPECT_THAT(job.error(), HasSubstr("not a TorchScript archive"));
}

TEST_F(JobCoreTest, RetryableFailuresDeadLetterAfterMaxAttempts) {
  auto submitted = core_->SubmitJob(Request({2}, {"60%"}));
  for (int attempt = 1; attempt <= 2; ++attempt) {
    auto lease = Lease();
    ASSERT_TRUE(lease.has_task()) << attempt;
    EXPECT_EQ(lease.task().attempt(), attempt);
    v1::FailTaskRequest fail;
    fail.set_worker_id(worker_);
    fail.set_task_id(lease.task().task_id());
    fail.set_fence_token(lease.task().fence_token());
    fail.set_reason("task process killed by signal 9");
    fail.set_retryable(true);
    ASSERT_TRUE(core_->FailTask(fail).ok());
  }
  EXPECT_FALSE(Lease().has_task());
  v1::Job job = *core_->GetJob(submitted->job().job_id());
  EXPECT_EQ(job.state(), v1::Job::FAILED);
  EXPECT_THAT(job.error(), HasSubstr("killed by signal 9"));
}

TEST_F(JobCoreTest, CancelStopsTheRunningTask) {
  auto submitted = core_->SubmitJob(Request({2, 4}, {"60%"}));
  auto lease = Lease();
  auto cancelled = core_->CancelJob(submitted->job().job_id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::Job::CANCELLED);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(worker_);
  hb.set_task_id(lease.task().task_id());
  hb.set_fence_token(lease.task().fence_token());
  auto beat = core_->Heartbeat(hb);
  EXPECT_FALSE(beat->lease_valid());
  EXPECT_TRUE(beat->cancelled());
  EXPECT_FALSE(Lease().has_task());
  EXPECT_EQ(core_->CancelJob(submitted->job().job_id()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobCoreTest, GetScheduleAnswersFromTheCacheTheSecondTime) {
  auto submitted = core_->SubmitJob(Request({2}, {"60%"}));
  ASSERT_TRUE(ReportProfile(Lease().task()).ok());
  v1::GetScheduleRequest r;
  r.set_job_id(submitted->job().job_id());
  r.set_batch_size(2);
  *r.mutable_budget() = *ParseBudget("45%");
  const double hits =
      CounterValue(metrics_, "mutwo_schedule_cache_requests_total", "hit");
  auto first = core_->GetSchedule(r);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(
      CounterValue(metrics_, "mutwo_schedule_cache_requests_total", "hit"),
      hits);
  auto second = core_->GetSchedule(r);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(
      CounterValue(metrics_, "mutwo_schedule_cache_requests_total", "hit"),
      hits + 1);
  EXPECT_EQ(first->SerializeAsString(), second->SerializeAsString());
  r.set_batch_size(64);
  EXPECT_THAT(std::string(core_->GetSchedule(r).status().message()),
              HasSubstr("has no profile for batch size 64"));
}

TEST_F(JobCoreTest, SubmitErrorsNameTheBadInput) {
  auto r = Request({2}, {"60%"});
  r.mutable_spec()->set_model_sha256(std::string(64, 'a'));
  EXPECT_EQ(core_->SubmitJob(r).status().code(), absl::StatusCode::kNotFound);
  r = Request({}, {"60%"});
  EXPECT_EQ(core_->SubmitJob(r).status().message(),
            "no batch sizes: give at least one");
  r = Request({2}, {});
  r.mutable_spec()->mutable_loss()->set_kind(v1::LossSpec::CROSS_ENTROPY);
  EXPECT_THAT(std::string(core_->SubmitJob(r).status().message()),
              HasSubstr("cross_entropy needs a target"));
  // What only a client other than ours sends: an mse target of integers,
  // a term with terms of its own.
  r.mutable_spec()->mutable_loss()->set_kind(v1::LossSpec::MSE);
  *r.mutable_spec()->mutable_loss()->mutable_target() =
      *ParseTensorSpec("z:int64[B]{0,4}");
  EXPECT_THAT(std::string(core_->SubmitJob(r).status().message()),
              HasSubstr("loss \"mse:z:int64[B]{0,4}\": an mse target is "
                        "compared with a floating-point output"));
  v1::LossSpec nested = *ParseLossSpec("mean@a+mse@b:z:float32[B]");
  *nested.mutable_terms(0)->add_terms() = *ParseLossSpec("sum@c");
  *r.mutable_spec()->mutable_loss() = nested;
  EXPECT_THAT(std::string(core_->SubmitJob(r).status().message()),
              HasSubstr("cannot have terms of its own"));
}

// A job whose model cannot take its inputs is refused at submit, naming the
// argument, and nothing is stored for it: the jobs before it and the model
// stay, and the same model with its inputs is queued.
TEST_F(JobCoreTest, SubmitRefusesInputsTheModelsForwardCannotTake) {
  ASSERT_TRUE(core_->SubmitJob(Request({2}, {"60%"})).ok());
  const std::string model =
      testing::ModelArchiveWithForward("x: Tensor,\n    y: Tensor");
  const std::string sha = Sha256Hex(model);
  ASSERT_TRUE(store_->PutModel(sha, "two", model.size(), model).ok());
  auto r = Request({2}, {"60%"});
  r.mutable_spec()->set_model_sha256(sha);
  r.mutable_spec()->set_model_name("two");
  const auto refused = core_->SubmitJob(r);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "model two.pt: forward's argument y (Tensor) has no --input spec "
            "and no default: give --input y:DTYPE[DIMS] (forward(x: Tensor, "
            "y: Tensor))");
  auto jobs = store_->ListJobs({});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs.size(), 1u);
  EXPECT_TRUE(*store_->HasModel(sha));

  *r.mutable_spec()->add_inputs() = *ParseTensorSpec("y:float32[B,16]");
  EXPECT_TRUE(core_->SubmitJob(r).ok());
}

TEST(UploadSessionTest, VerifiesSizeHashAndLimit) {
  const std::string bytes(1000, 'x');
  v1::UploadModelHeader header;
  header.set_size_bytes(1000);
  header.set_sha256(Sha256Hex(bytes));
  {
    UploadSession ok(1 << 20);
    ASSERT_TRUE(ok.Header(header).ok());
    ASSERT_TRUE(ok.Chunk(bytes.substr(0, 600)).ok());
    ASSERT_TRUE(ok.Chunk(bytes.substr(600)).ok());
    EXPECT_TRUE(ok.Finish().ok());
  }
  {
    UploadSession small(999);
    EXPECT_EQ(small.Header(header).code(),
              absl::StatusCode::kResourceExhausted);
  }
  {
    UploadSession wrong(1 << 20);
    auto h = header;
    h.set_sha256(Sha256Hex("other"));
    ASSERT_TRUE(wrong.Header(h).ok());
    ASSERT_TRUE(wrong.Chunk(bytes).ok());
    EXPECT_THAT(std::string(wrong.Finish().message()),
                HasSubstr("but the bytes hash to"));
  }
  {
    UploadSession short_upload(1 << 20);
    ASSERT_TRUE(short_upload.Header(header).ok());
    ASSERT_TRUE(short_upload.Chunk(bytes.substr(0, 10)).ok());
    EXPECT_EQ(short_upload.Finish().message(),
              "upload: declared 1000 bytes but received 10");
  }
  {
    UploadSession no_header(1 << 20);
    EXPECT_EQ(no_header.Chunk("abc").code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Uploads stream to a temp file of the store (never whole in memory), and a
// principal runs at most 2 at once with at most 2 x max_model_bytes (2 MiB
// here) declared between them.
TEST_F(JobCoreTest, UploadsStreamToDiskWithinPerClientLimits) {
  const std::string bytes(300 << 10, 'm');
  v1::UploadModelHeader header;
  header.set_sha256(Sha256Hex(bytes));
  header.set_size_bytes(bytes.size());
  header.set_name("streamed");
  auto first = core_->NewUpload("alice");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Header(header).ok());
  ASSERT_NE((*first)->file(), nullptr);
  const std::string temp = (*first)->file()->path();
  ASSERT_TRUE((*first)->Chunk(bytes.substr(0, 100 << 10)).ok());
  // Already on disk while the upload runs.
  EXPECT_EQ(std::filesystem::file_size(temp), size_t{100} << 10);
  auto second = core_->NewUpload("alice");
  ASSERT_TRUE(second.ok());
  auto third = core_->NewUpload("alice");
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_TRUE(core_->NewUpload("bob").ok()) << "another client is not limited";
  // The byte quota: 300 KiB running, 1.9 MiB more would pass 2 MiB.
  v1::UploadModelHeader big = header;
  big.set_size_bytes(1900 << 10);
  EXPECT_TRUE(absl::IsResourceExhausted((*second)->Header(big)));
  ASSERT_TRUE((*first)->Chunk(bytes.substr(100 << 10)).ok());
  ASSERT_TRUE((*first)->Finish().ok());
  auto stored = core_->StoreUpload(**first, "alice");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_EQ(std::filesystem::file_size(*store_->ModelPath(header.sha256())),
            bytes.size());
  first->reset();
  second->reset();
  EXPECT_TRUE(core_->NewUpload("alice").ok()) << "slots are given back";
  // An abandoned upload leaves no file behind.
  {
    auto abandoned = core_->NewUpload("carol");
    ASSERT_TRUE((*abandoned)->Header(header).ok());
    const std::string path = (*abandoned)->file()->path();
    ASSERT_TRUE((*abandoned)->Chunk("partial").ok());
    abandoned->reset();
    EXPECT_FALSE(std::filesystem::exists(path));
  }
}

// Issue 17: a job for a device kind no live worker has says so, and the
// gauge counts it, until such a worker registers.
TEST_F(JobCoreTest, JobWaitingForADeviceNoLiveWorkerHasSaysWhy) {
  const std::string gauge = "mutwo_jobs_waiting_for_device";
  auto cuda_request = Request({2, 4}, {"50%"});
  cuda_request.mutable_spec()->set_device_kind("cuda");
  auto cuda_job = core_->SubmitJob(cuda_request);
  ASSERT_TRUE(cuda_job.ok()) << cuda_job.status();
  const std::string cuda_id = cuda_job->job().job_id();
  EXPECT_EQ(cuda_job->job().waiting(), "no cuda worker registered");
  EXPECT_EQ(core_->GetJob(cuda_id)->waiting(), "no cuda worker registered");
  auto cpu_request = Request({2}, {"50%"});
  cpu_request.mutable_spec()->set_device_kind("cpu");
  const std::string cpu_id = core_->SubmitJob(cpu_request)->job().job_id();
  EXPECT_EQ(core_->GetJob(cpu_id)->waiting(), "");  // the cpu worker can
  EXPECT_EQ(GaugeValue(metrics_, gauge, "cuda"), 1);
  EXPECT_EQ(GaugeValue(metrics_, gauge, "cpu"), 0);
  EXPECT_EQ(GaugeValue(metrics_, gauge, "any"), 0);
  // WatchJob's long poll carries it too.
  auto watched = core_->WaitForJobChange(
      cuda_id, core_->GetJob(cuda_id)->updated_unix_ms(), 10);
  EXPECT_EQ(watched->waiting(), "no cuda worker registered");

  // Every worker misses its heartbeats: both jobs wait, and say why.
  now_ms_ += 10'000;
  core_->Reap();
  EXPECT_EQ(core_->GetJob(cpu_id)->waiting(),
            "no live cpu worker (1 registered, all lost: missed heartbeats)");
  EXPECT_EQ(GaugeValue(metrics_, gauge, "cpu"), 1);

  // A cuda worker registers: the cuda job waits no more.
  v1::RegisterWorkerRequest reg;
  reg.mutable_worker()->mutable_device()->set_kind("cuda");
  reg.mutable_worker()->mutable_device()->set_name("H100");
  ASSERT_TRUE(core_->RegisterWorker(reg).ok());
  EXPECT_EQ(core_->GetJob(cuda_id)->waiting(), "");
  EXPECT_EQ(GaugeValue(metrics_, gauge, "cuda"), 0);
  EXPECT_EQ(GaugeValue(metrics_, gauge, "cpu"), 1);
  // Finished jobs never wait.
  ASSERT_TRUE(core_->CancelJob(cpu_id).ok());
  EXPECT_EQ(core_->GetJob(cpu_id)->waiting(), "");
  EXPECT_EQ(GaugeValue(metrics_, gauge, "cpu"), 0);
}

// A poll whose worker went away (the RPC was cancelled) must not keep the
// task it leased: it is given back at once, attempt unchanged, and the next
// worker gets it (8 of 8 jobs went to a dead worker's poll).
TEST_F(JobCoreTest, TaskLeasedForAnAbandonedPollIsGivenBackAtOnce) {
  auto submitted = core_->SubmitJob(Request({2}, {"60%"}));
  ASSERT_TRUE(submitted.ok());
  v1::LeaseTaskRequest r;
  r.set_worker_id(worker_);
  auto abandoned = core_->LeaseTask(r, [] { return true; });
  EXPECT_TRUE(absl::IsCancelled(abandoned.status())) << abandoned.status();
  auto tasks = *store_->ListTasks(submitted->job().job_id());
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].state(), v1::Task::QUEUED);
  EXPECT_EQ(tasks[0].attempt(), 1);
  auto lease = Lease();
  ASSERT_TRUE(lease.has_task());
  EXPECT_EQ(lease.task().task_id(), tasks[0].task_id());
}

TEST_F(JobCoreTest, LongPollEndsSoonAfterTheCallerLeaves) {
  v1::LeaseTaskRequest r;
  r.set_worker_id(worker_);
  r.set_wait_ms(20000);
  std::atomic<bool> gone{false};
  std::thread leave([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto lease = core_->LeaseTask(r, [&] { return gone.load(); });
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  leave.join();
  EXPECT_TRUE(absl::IsCancelled(lease.status())) << lease.status();
  EXPECT_LT(ms, 1000);
}

TEST_F(JobCoreTest, StoppedWorkerIsNeverLeasedUntilItRegistersAgain) {
  v1::HeartbeatRequest bye;
  bye.set_worker_id(worker_);
  bye.set_stopping(true);
  ASSERT_TRUE(core_->Heartbeat(bye).ok());
  EXPECT_EQ(store_->GetWorker(worker_)->state(), v1::WorkerInfo::STOPPED);
  ASSERT_TRUE(core_->SubmitJob(Request({2}, {"60%"})).ok());
  v1::LeaseTaskRequest r;
  r.set_worker_id(worker_);
  auto refused = core_->LeaseTask(r);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("register again"));
  // Nothing was leased to it.
  EXPECT_EQ(store_->CountTasksByState()->at(v1::Task::LEASED), 0);
  v1::RegisterWorkerRequest reg;
  reg.mutable_worker()->set_worker_id(worker_);
  reg.mutable_worker()->mutable_device()->set_kind("cpu");
  ASSERT_TRUE(core_->RegisterWorker(reg).ok());
  EXPECT_TRUE(Lease().has_task());
}

TEST_F(JobCoreTest, SilentWorkersAreForgottenAfterTheGracePeriod) {
  // Lost after 3 lease timeouts (3 s here), forgotten an hour later.
  now_ms_ += 4000;
  core_->Reap();
  EXPECT_EQ(store_->GetWorker(worker_)->state(), v1::WorkerInfo::LOST);
  now_ms_ += 60 * 60 * 1000;
  core_->Reap();
  EXPECT_TRUE(absl::IsNotFound(store_->GetWorker(worker_).status()));
  EXPECT_TRUE(store_->ListWorkers()->empty());
}

}  // namespace
}  // namespace mutwo
