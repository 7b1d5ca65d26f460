// JobCore against a real Store (temp dir, injected clock) and the real
// planner: the job state machine, leases, fencing, re-queueing, dead letters,
// cancellation, the schedule cache and upload verification.
#include "server/job_core.h"

#include <atomic>
#include <filesystem>

#include "common/parse.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/proto_convert.h"
#include "tests/testing/synthetic_profile.h"

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
    core_ = *JobCore::Create(
        o, store_.get(), &metrics_,
        [](const v1::Profile& p, const v1::MemoryBudget& b, v1::Policy policy,
           bool pareto) {
          planner::ScheduleRequest r;
          r.budget = b;
          r.policy = policy;
          r.pareto_points = pareto ? 20 : 0;
          return planner::PlanSchedule(p, r);
        },
        [](const std::vector<v1::Profile>& ps, double overhead) {
          return planner::PredictMaxBatchProto(ps, 0, overhead);
        });
    model_ = "not really torchscript, the core never loads it";
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

  absl::Status ReportValidation(const v1::Task& task) {
    v1::ReportValidationRequest r;
    r.set_worker_id(worker_);
    r.set_task_id(task.task_id());
    r.set_fence_token(task.fence_token());
    auto* v = r.mutable_validation();
    v->set_budget_bytes(task.schedule().budget_bytes());
    v->mutable_scheduled()->set_peak_bytes(
        task.schedule().predicted_peak_bytes());
    v->set_within_budget(true);
    v->set_gradients_match(true);
    return core_->ReportValidation(r);
  }

  std::filesystem::path dir_;
  std::atomic<int64_t> now_ms_{1'700'000'000'000};
  ServerMetrics metrics_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<JobCore> core_;
  std::string model_, sha_, worker_;
};

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
  EXPECT_FALSE(Lease().has_task());
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

}  // namespace
}  // namespace mutwo
