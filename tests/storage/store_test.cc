#include "storage/store.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/durable_file.h"
#include "storage/schema.h"
#include "storage/sqlite.h"
#include "tests/storage/temp_dir.h"

namespace mutwo::storage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

const std::string kSha(64, 'a');
const std::string kOtherSha(64, 'b');

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class StoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> OpenStore() {
    Store::Options options;
    options.data_dir = dir_.path() + "/data";
    options.now_ms = [this] { return now_ms_.load(); };
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::string DataDir() const { return dir_.path() + "/data"; }
  std::string ModelsDir() const { return DataDir() + "/models"; }

  // A raw connection to the same file, for checks the API does not offer.
  std::unique_ptr<Db> RawDb() {
    absl::StatusOr<std::unique_ptr<Db>> db =
        Db::Open(DataDir() + "/mutwo.db", 5000);
    EXPECT_TRUE(db.ok()) << db.status();
    return std::move(*db);
  }

  void PutModel(Store& store, const std::string& sha = kSha) {
    ASSERT_TRUE(store.PutModel(sha, "tiny", 5, "bytes").ok());
  }

  v1::JobSpec Spec(const std::string& sha = kSha,
                   const std::string& device_kind = "") {
    v1::JobSpec spec;
    spec.set_model_sha256(sha);
    spec.set_model_name("tiny");
    *spec.add_inputs() = *ParseTensorSpec("x:float32[B,8]");
    spec.add_batch_sizes(8);
    spec.set_device_kind(device_kind);
    return spec;
  }

  v1::Job NewJob(Store& store, const std::string& device_kind = "") {
    absl::StatusOr<CreateJobResult> created =
        store.CreateJob(Spec(kSha, device_kind), "", "");
    EXPECT_TRUE(created.ok()) << created.status();
    return created->job;
  }

  v1::Task NewTask(Store& store, const std::string& job_id,
                   int64_t batch_size = 8) {
    absl::StatusOr<v1::Task> task =
        store.AddTask(job_id, v1::Task::PROFILE, batch_size);
    EXPECT_TRUE(task.ok()) << task.status();
    return *task;
  }

  testing::TempDir dir_;
  std::atomic<int64_t> now_ms_{1'700'000'000'000};
};

// ---------------------------------------------------------------------------
// Open, schema, reopen
// ---------------------------------------------------------------------------

TEST_F(StoreTest, OpenOnEmptyDirCreatesMigratedWalDatabase) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(std::filesystem::is_directory(ModelsDir()));
  auto db = RawDb();
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(*db->QueryText("PRAGMA journal_mode"), "wal");
  for (const char* table :
       {"models", "jobs", "tasks", "task_results", "profiles", "schedules",
        "validations", "workers"}) {
    EXPECT_EQ(*db->QueryInt(absl::StrCat(
                  "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' "
                  "AND name = '",
                  table, "'")),
              1)
        << table;
  }
}

TEST_F(StoreTest, ReopenKeepsEveryKindOfRecord) {
  std::string job_id, task_id, worker_id;
  int64_t first_fence = 0;
  ScheduleCacheKey key;
  {
    auto store = OpenStore();
    PutModel(*store);
    job_id = NewJob(*store).job_id();
    task_id = NewTask(*store, job_id).task_id();
    auto leased = store->LeaseTask("w1", "cpu", 10'000);
    ASSERT_TRUE(leased.ok() && leased->has_value());
    first_fence = (*leased)->fence_token();
    ASSERT_TRUE(*store->CompleteTask(task_id, first_fence, "w1", "result-1"));
    v1::Profile profile;
    profile.set_graph_fingerprint("fp-1");
    ASSERT_TRUE(store->PutProfile(job_id, 8, profile).ok());
    v1::DeviceInfo device;
    device.set_kind("cpu");
    device.set_name("cpu");
    device.set_libtorch_version("1.13.1");
    key =
        MakeScheduleCacheKey(Spec(), 8, device, *ParseBudget("60%"), v1::MUTWO);
    v1::Schedule schedule;
    schedule.set_predicted_peak_bytes(1234);
    ASSERT_TRUE(store->PutSchedule(key, job_id, schedule).ok());
    v1::Validation validation;
    validation.set_within_budget(true);
    ASSERT_TRUE(store->PutValidation(job_id, 8, "60%", 1, validation).ok());
    worker_id = store->UpsertWorker(v1::WorkerInfo(), "")->worker_id();
  }
  auto store = OpenStore();
  EXPECT_TRUE(*store->HasModel(kSha));
  EXPECT_EQ(store->GetJob(job_id)->spec().model_name(), "tiny");
  EXPECT_EQ(store->GetTask(task_id)->state(), v1::Task::DONE);
  EXPECT_EQ(*store->GetTaskResult(task_id), "result-1");
  EXPECT_EQ(store->GetProfile(job_id, 8)->graph_fingerprint(), "fp-1");
  auto cached = store->GetCachedSchedule(key);
  ASSERT_TRUE(cached.ok() && cached->has_value());
  EXPECT_EQ((*cached)->predicted_peak_bytes(), 1234);
  EXPECT_THAT(*store->ListValidations(job_id), SizeIs(1));
  EXPECT_THAT(*store->ListWorkers(), SizeIs(1));
  // Fence tokens keep increasing across restarts.
  const std::string second = NewTask(*store, job_id).task_id();
  auto leased = store->LeaseTask("w1", "cpu", 10'000);
  ASSERT_TRUE(leased.ok() && leased->has_value());
  EXPECT_EQ((*leased)->task_id(), second);
  EXPECT_GT((*leased)->fence_token(), first_fence);
}

TEST_F(StoreTest, RefusesDatabaseFromNewerVersion) {
  OpenStore().reset();
  RawDb()
      ->Exec(absl::StrCat("PRAGMA user_version = ", LatestSchemaVersion() + 1))
      .IgnoreError();
  Store::Options options;
  options.data_dir = DataDir();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      store.status().message(),
      HasSubstr(absl::StrCat("schema version ", LatestSchemaVersion() + 1)));
  EXPECT_THAT(store.status().message(), HasSubstr("newer"));
}

TEST_F(StoreTest, OpenRefusesDataDirThatIsAFile) {
  std::ofstream(DataDir()) << "not a directory";
  Store::Options options;
  options.data_dir = DataDir();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(DataDir()));
}

// ---------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------

TEST_F(StoreTest, PutModelWritesContentAddressedFileOnceAndIsIdempotent) {
  auto store = OpenStore();
  const std::string bytes(100'000, 'm');
  auto first = store->PutModel(kSha, "resnet", bytes.size(), bytes);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->already_stored);
  EXPECT_EQ(first->info.path, ModelsDir() + "/" + kSha + ".pt");
  EXPECT_EQ(ReadAll(first->info.path), bytes);
  EXPECT_THAT(ListDir(ModelsDir()), ElementsAre(kSha + ".pt"));  // no temps
  struct stat before;
  ASSERT_EQ(stat(first->info.path.c_str(), &before), 0);

  auto second = store->PutModel(kSha, "other-name", bytes.size(), bytes);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->already_stored);
  EXPECT_EQ(second->info.name, "resnet");
  struct stat after;
  ASSERT_EQ(stat(first->info.path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // not rewritten
  EXPECT_EQ(*store->TotalModelBytes(), 100'000);
  EXPECT_TRUE(*store->HasModel(kSha));
  EXPECT_EQ(store->GetModelInfo(kSha)->size_bytes, 100'000);
}

TEST_F(StoreTest, PutModelRestoresAFileThatWentMissing) {
  auto store = OpenStore();
  ASSERT_TRUE(store->PutModel(kSha, "m", 5, "bytes").ok());
  std::filesystem::remove(ModelsDir() + "/" + kSha + ".pt");
  EXPECT_FALSE(*store->HasModel(kSha));  // the row alone is not a model
  auto again = store->PutModel(kSha, "m", 5, "bytes");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->already_stored);
  EXPECT_TRUE(*store->HasModel(kSha));
  EXPECT_EQ(ReadAll(again->info.path), "bytes");
}

TEST_F(StoreTest, PutModelWithSizeMismatchStoresNothing) {
  auto store = OpenStore();
  auto put = store->PutModel(kSha, "m", 10, "only-9-b!");
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("declared size 10"));
  EXPECT_THAT(ListDir(ModelsDir()), SizeIs(0));
  EXPECT_FALSE(*store->HasModel(kSha));
  EXPECT_EQ(*store->TotalModelBytes(), 0);
  EXPECT_EQ(store->GetModelInfo(kSha).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, MalformedSha256IsRefusedBeforeTouchingDisk) {
  auto store = OpenStore();
  for (const std::string& bad :
       {std::string("../../etc/passwd"), std::string(64, 'A'),
        std::string(63, 'a'), std::string(63, 'a') + "/"}) {
    auto put = store->PutModel(bad, "m", 1, "x");
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(store->ModelPath(bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(ListDir(ModelsDir()), SizeIs(0));
}

// A write that fails half way (here: the file size limit, as a full disk
// would) leaves neither a partial model file nor a temp file nor a row.
TEST_F(StoreTest, FailedModelWriteLeavesNoPartialFile) {
  OpenStore().reset();  // create the database before limiting file sizes
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {256 * 1024, 256 * 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    Store::Options options;
    options.data_dir = DataDir();
    auto store = Store::Open(options);
    if (!store.ok()) _exit(10);
    const std::string bytes(1 << 20, 'z');
    auto put = (*store)->PutModel(kSha, "big", bytes.size(), bytes);
    _exit(put.status().code() == absl::StatusCode::kResourceExhausted ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: open failed, 11: wrong status";
  EXPECT_THAT(ListDir(ModelsDir()), SizeIs(0));
  auto store = OpenStore();
  EXPECT_FALSE(*store->HasModel(kSha));
  EXPECT_EQ(*store->TotalModelBytes(), 0);
}

TEST_F(StoreTest, OpenRemovesOnlyStaleTempFiles) {
  OpenStore().reset();
  const std::string stale = ModelsDir() + "/" + kTempFilePrefix + "old";
  const std::string fresh = ModelsDir() + "/" + kTempFilePrefix + "new";
  std::ofstream(stale) << "partial";
  std::ofstream(fresh) << "partial";
  struct timeval times[2];
  gettimeofday(&times[0], nullptr);
  times[0].tv_sec -= 2 * 3600;
  times[1] = times[0];
  ASSERT_EQ(utimes(stale.c_str(), times), 0);
  OpenStore().reset();
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(fresh));  // may be a live writer's
}

// ---------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------

TEST_F(StoreTest, RepeatedClientRequestIdReturnsTheFirstJob) {
  auto store = OpenStore();
  PutModel(*store);
  auto first = store->CreateJob(Spec(), "req-1", "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->deduplicated);
  EXPECT_EQ(first->job.state(), v1::Job::QUEUED);
  EXPECT_EQ(first->job.client_request_id(), "req-1");
  now_ms_ += 1000;
  auto again = store->CreateJob(Spec(), "req-1", "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->job.job_id(), first->job.job_id());
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 1u);

  v1::JobSpec different = Spec();
  different.add_batch_sizes(16);
  auto misuse = store->CreateJob(different, "req-1", "");
  EXPECT_EQ(misuse.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(misuse.status().message(), HasSubstr(first->job.job_id()));

  // No request id: every call is a new job.
  EXPECT_NE(store->CreateJob(Spec(), "", "")->job.job_id(),
            store->CreateJob(Spec(), "", "")->job.job_id());
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 3u);
}

TEST_F(StoreTest, CreateJobNeedsTheModelStored) {
  auto store = OpenStore();
  auto job = store->CreateJob(Spec(kOtherSha), "", "");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job.status().message(), HasSubstr(kOtherSha));
}

TEST_F(StoreTest, ListJobsPagesAreNewestFirstAndStableUnderInserts) {
  auto store = OpenStore();
  PutModel(*store);
  std::vector<std::string> ids;
  for (int i = 0; i < 7; ++i) {
    ids.insert(ids.begin(), NewJob(*store).job_id());  // newest first
  }
  ListJobsQuery query;
  query.page_size = 3;
  auto page1 = store->ListJobs(query);
  ASSERT_TRUE(page1.ok()) << page1.status();
  ASSERT_THAT(page1->jobs, SizeIs(3));
  ASSERT_FALSE(page1->next_page_token.empty());
  // Jobs submitted while the client pages do not shift the later pages.
  NewJob(*store);
  NewJob(*store);
  query.page_token = page1->next_page_token;
  auto page2 = store->ListJobs(query);
  ASSERT_TRUE(page2.ok()) << page2.status();
  query.page_token = page2->next_page_token;
  auto page3 = store->ListJobs(query);
  ASSERT_TRUE(page3.ok()) << page3.status();
  EXPECT_TRUE(page3->next_page_token.empty());
  std::vector<std::string> seen;
  for (const auto* page : {&*page1, &*page2, &*page3}) {
    for (const v1::Job& job : page->jobs) seen.push_back(job.job_id());
  }
  EXPECT_EQ(seen, ids);

  query.page_token = "garbage";
  EXPECT_EQ(store->ListJobs(query).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, ListJobsFiltersByStateAndModel) {
  auto store = OpenStore();
  PutModel(*store, kSha);
  PutModel(*store, kOtherSha);
  const std::string a = NewJob(*store).job_id();
  const std::string b = store->CreateJob(Spec(kOtherSha), "", "")->job.job_id();
  ASSERT_TRUE(store
                  ->UpdateJob(a,
                              [](v1::Job& job) {
                                job.set_state(v1::Job::PROFILING);
                                return absl::OkStatus();
                              })
                  .ok());
  ListJobsQuery by_state;
  by_state.states = {v1::Job::PROFILING};
  auto profiling = store->ListJobs(by_state);
  ASSERT_THAT(profiling->jobs, SizeIs(1));
  EXPECT_EQ(profiling->jobs[0].job_id(), a);
  ListJobsQuery by_model;
  by_model.model_sha256 = kOtherSha;
  auto other = store->ListJobs(by_model);
  ASSERT_THAT(other->jobs, SizeIs(1));
  EXPECT_EQ(other->jobs[0].job_id(), b);
}

TEST_F(StoreTest, UpdateJobAppliesMutationOrNothing) {
  auto store = OpenStore();
  PutModel(*store);
  const v1::Job job = NewJob(*store);
  now_ms_ += 5000;
  auto updated = store->UpdateJob(job.job_id(), [](v1::Job& j) {
    j.set_state(v1::Job::PROFILING);
    j.set_tasks_total(3);
    j.set_job_id("hijacked");  // identity fields are not editable
    return absl::OkStatus();
  });
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->job_id(), job.job_id());
  EXPECT_EQ(updated->updated_unix_ms(), job.created_unix_ms() + 5000);
  auto failed = store->UpdateJob(job.job_id(), [](v1::Job& j) {
    j.set_state(v1::Job::FAILED);
    return absl::FailedPreconditionError("illegal transition");
  });
  EXPECT_EQ(failed.status().message(), "illegal transition");
  auto stored = store->GetJob(job.job_id());
  EXPECT_EQ(stored->state(), v1::Job::PROFILING);
  EXPECT_EQ(stored->tasks_total(), 3);
  auto counts = store->CountJobsByState();
  EXPECT_EQ((*counts)[v1::Job::PROFILING], 1);
  EXPECT_EQ((*counts)[v1::Job::QUEUED], 0);
  EXPECT_EQ(store->GetJob("job-missing").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(store->GetJob("job-missing").status().message(),
              HasSubstr("job-missing"));
}

TEST_F(StoreTest, CorruptRowIsDataLossNotACrash) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  ASSERT_TRUE(RawDb()
                  ->Exec(absl::StrCat("UPDATE jobs SET job = x'ffffffff' "
                                      "WHERE job_id = '",
                                      job_id, "'"))
                  .ok());
  auto job = store->GetJob(job_id);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(job.status().message(), HasSubstr(job_id));
  EXPECT_EQ(store->ListJobs({}).status().code(), absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------------------
// Tasks, leases, fencing
// ---------------------------------------------------------------------------

TEST_F(StoreTest, LeaseHeartbeatCompleteStoresOneResult) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  const std::string task_id = NewTask(*store, job_id).task_id();
  auto leased = store->LeaseTask("w1", "cpu", 1000);
  ASSERT_TRUE(leased.ok() && leased->has_value()) << leased.status();
  const v1::Task& task = **leased;
  EXPECT_EQ(task.task_id(), task_id);
  EXPECT_EQ(task.state(), v1::Task::LEASED);
  EXPECT_EQ(task.lease_owner(), "w1");
  EXPECT_EQ(task.attempt(), 1);
  EXPECT_EQ(task.lease_expiry_unix_ms(), now_ms_ + 1000);
  EXPECT_FALSE(store->LeaseTask("w2", "cpu", 1000)->has_value());

  now_ms_ += 800;
  auto extended = store->ExtendLease(task_id, task.fence_token(), "w1", 1000);
  ASSERT_TRUE(extended.ok()) << extended.status();
  EXPECT_EQ(extended->lease_expiry_unix_ms(), now_ms_ + 1000);
  now_ms_ += 800;  // past the first expiry, within the extended one
  EXPECT_THAT(*store->RequeueExpiredLeases(3), SizeIs(0));

  EXPECT_TRUE(*store->CompleteTask(task_id, task.fence_token(), "w1", "r1"));
  // The same worker retrying its report stores nothing new.
  EXPECT_FALSE(
      *store->CompleteTask(task_id, task.fence_token(), "w1", "r1-again"));
  EXPECT_EQ(*store->GetTaskResult(task_id), "r1");
  EXPECT_EQ(store->GetTask(task_id)->state(), v1::Task::DONE);
  auto late = store->ExtendLease(task_id, task.fence_token(), "w1", 1000);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("DONE"));
  EXPECT_FALSE(store->LeaseTask("w1", "cpu", 1000)->has_value());
}

TEST_F(StoreTest, StaleFenceIsRejectedAfterExpiredLeaseIsRequeued) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  const std::string task_id = NewTask(*store, job_id).task_id();
  const v1::Task first = **store->LeaseTask("slow", "cpu", 1000);
  now_ms_ += 1001;
  auto requeued = store->RequeueExpiredLeases(3);
  ASSERT_THAT(*requeued, SizeIs(1));
  EXPECT_EQ((*requeued)[0].state(), v1::Task::QUEUED);
  EXPECT_EQ((*requeued)[0].attempt(), 2);
  EXPECT_THAT((*requeued)[0].last_error(), HasSubstr("lease expired"));

  const v1::Task second = **store->LeaseTask("fast", "cpu", 1000);
  EXPECT_EQ(second.task_id(), task_id);
  EXPECT_GT(second.fence_token(), first.fence_token());

  auto beat = store->ExtendLease(task_id, first.fence_token(), "slow", 1000);
  EXPECT_EQ(beat.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(beat.status().message(), HasSubstr("stale fence token"));
  auto stale =
      store->CompleteTask(task_id, first.fence_token(), "slow", "slow");
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      *store->CompleteTask(task_id, second.fence_token(), "fast", "fast"));
  stale = store->CompleteTask(task_id, first.fence_token(), "slow", "slow");
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->FailTask(task_id, first.fence_token(), "slow", "x", true, 3)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(*store->GetTaskResult(task_id), "fast");
  EXPECT_EQ(*RawDb()->QueryInt("SELECT COUNT(*) FROM task_results"), 1);
}

TEST_F(StoreTest, DeadLetterAfterMaxAttemptsKeepsTheLastReason) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  const std::string task_id = NewTask(*store, job_id).task_id();
  v1::Task task;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto leased = store->LeaseTask("w", "cpu", 1000);
    ASSERT_TRUE(leased.ok() && leased->has_value()) << attempt;
    EXPECT_EQ((*leased)->attempt(), attempt);
    task = *store->FailTask(task_id, (*leased)->fence_token(), "w",
                            absl::StrCat("child crashed, attempt ", attempt),
                            /*retryable=*/true, /*max_attempts=*/3);
  }
  EXPECT_EQ(task.state(), v1::Task::FAILED);
  EXPECT_EQ(task.attempt(), 3);
  EXPECT_EQ(task.last_error(), "child crashed, attempt 3");
  EXPECT_EQ(store->GetTask(task_id)->state(), v1::Task::FAILED);
  EXPECT_FALSE(store->LeaseTask("w", "cpu", 1000)->has_value());

  // Not retryable: dead at once. Expired on the last attempt: dead too.
  const std::string second = NewTask(*store, job_id).task_id();
  auto leased = store->LeaseTask("w", "cpu", 1000);
  EXPECT_EQ(store
                ->FailTask(second, (*leased)->fence_token(), "w", "bad model",
                           /*retryable=*/false, 3)
                ->state(),
            v1::Task::FAILED);
  const std::string third = NewTask(*store, job_id).task_id();
  ASSERT_TRUE(store->LeaseTask("w", "cpu", 1000)->has_value());
  now_ms_ += 2000;
  auto expired = store->RequeueExpiredLeases(/*max_attempts=*/1);
  ASSERT_THAT(*expired, SizeIs(1));
  EXPECT_EQ((*expired)[0].task_id(), third);
  EXPECT_EQ((*expired)[0].state(), v1::Task::FAILED);
  EXPECT_THAT((*expired)[0].last_error(), HasSubstr("attempt 1 of 1"));
  auto counts = store->CountTasksByState();
  EXPECT_EQ((*counts)[v1::Task::FAILED], 3);
  EXPECT_EQ((*counts)[v1::Task::QUEUED], 0);
}

TEST_F(StoreTest, CountsJobsWithQueuedTasksByDeviceKind) {
  auto store = OpenStore();
  PutModel(*store);
  EXPECT_TRUE(store->CountJobsWithQueuedTasksByDeviceKind()->empty());
  const std::string cuda_a = NewJob(*store, "cuda").job_id();
  const std::string cuda_b = NewJob(*store, "cuda").job_id();
  const std::string any = NewJob(*store).job_id();
  const std::string cancelled = NewJob(*store, "cuda").job_id();
  NewTask(*store, cuda_a, 8);
  NewTask(*store, cuda_a, 16);  // one job, two queued tasks
  NewTask(*store, cuda_b);
  NewTask(*store, any);
  NewTask(*store, cancelled);
  ASSERT_TRUE(store
                  ->UpdateJob(cancelled,
                              [](v1::Job& j) {
                                j.set_state(v1::Job::CANCELLED);
                                return absl::OkStatus();
                              })
                  .ok());
  auto counts = store->CountJobsWithQueuedTasksByDeviceKind();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts, (std::map<std::string, int64_t>{{"", 1}, {"cuda", 2}}));
  // Leased tasks are not waiting: cuda_a has none queued any more.
  ASSERT_TRUE(store->LeaseTask("w", "cpu", 1000)->has_value());   // any's
  ASSERT_TRUE(store->LeaseTask("w", "cuda", 1000)->has_value());  // cuda_a's
  ASSERT_TRUE(store->LeaseTask("w", "cuda", 1000)->has_value());  // cuda_a's
  EXPECT_EQ(*store->CountJobsWithQueuedTasksByDeviceKind(),
            (std::map<std::string, int64_t>{{"cuda", 1}}));
}

TEST_F(StoreTest, CancelledJobsTasksAreNeverLeased) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string cancelled = NewJob(*store).job_id();
  const std::string live = NewJob(*store).job_id();
  const std::string leased_before = NewTask(*store, cancelled).task_id();
  const v1::Task held = **store->LeaseTask("w", "cpu", 10'000);
  ASSERT_EQ(held.task_id(), leased_before);
  NewTask(*store, cancelled);
  NewTask(*store, cancelled);
  const std::string live_task = NewTask(*store, live).task_id();
  ASSERT_TRUE(store
                  ->UpdateJob(cancelled,
                              [](v1::Job& job) {
                                job.set_state(v1::Job::CANCELLED);
                                return absl::OkStatus();
                              })
                  .ok());
  // Even before CancelJobTasks runs, the job state keeps its tasks back.
  auto next = store->LeaseTask("w", "cpu", 10'000);
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ((*next)->task_id(), live_task);
  EXPECT_FALSE(store->LeaseTask("w", "cpu", 10'000)->has_value());

  EXPECT_EQ(*store->CancelJobTasks(cancelled), 3);  // 2 queued + 1 leased
  const std::vector<v1::Task> tasks = *store->ListTasks(cancelled);
  ASSERT_EQ(tasks.size(), 3u);
  for (const v1::Task& task : tasks) {
    EXPECT_EQ(task.state(), v1::Task::CANCELLED);
  }
  auto beat = store->ExtendLease(leased_before, held.fence_token(), "w", 1000);
  EXPECT_EQ(beat.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(beat.status().message(), HasSubstr("CANCELLED"));
  EXPECT_EQ(store->AddTask(cancelled, v1::Task::PROFILE, 8).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StoreTest, TasksGoToWorkersOfTheRequestedDeviceKind) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string gpu_task =
      NewTask(*store, NewJob(*store, "cuda").job_id()).task_id();
  EXPECT_FALSE(store->LeaseTask("cpu-worker", "cpu", 1000)->has_value());
  const std::string any_task =
      NewTask(*store, NewJob(*store, "").job_id()).task_id();
  EXPECT_EQ((*store->LeaseTask("cpu-worker", "cpu", 1000))->task_id(),
            any_task);
  EXPECT_EQ((*store->LeaseTask("gpu-worker", "cuda", 1000))->task_id(),
            gpu_task);
}

TEST_F(StoreTest, ArgumentsAreValidated) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  EXPECT_EQ(store->LeaseTask("w", "cpu", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->LeaseTask("", "cpu", 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->AddTask(job_id, v1::Task::PROFILE, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->AddTask(job_id, v1::Task::VALIDATE, 8).status().code(),
            absl::StatusCode::kInvalidArgument);  // needs a schedule
  EXPECT_EQ(store->AddTask("job-nope", v1::Task::PROFILE, 8).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->RequeueExpiredLeases(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CompleteTask("task-nope", 1, "w", "r").status().code(),
            absl::StatusCode::kNotFound);
  ListJobsQuery query;
  query.page_size = -1;
  EXPECT_EQ(store->ListJobs(query).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, ValidateTaskCarriesItsSchedule) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  v1::Schedule schedule;
  schedule.set_budget_bytes(4096);
  schedule.add_decisions()->set_action(v1::Decision::RECOMPUTE);
  ASSERT_TRUE(store->AddTask(job_id, v1::Task::VALIDATE, 16, schedule).ok());
  const v1::Task task = **store->LeaseTask("w", "cpu", 1000);
  EXPECT_EQ(task.kind(), v1::Task::VALIDATE);
  EXPECT_EQ(task.batch_size(), 16);
  EXPECT_EQ(task.schedule().budget_bytes(), 4096);
  EXPECT_EQ(task.schedule().decisions_size(), 1);
}

TEST_F(StoreTest, LockHeldByAnotherConnectionFailsAfterTheBusyTimeout) {
  OpenStore().reset();
  Store::Options options;
  options.data_dir = DataDir();
  options.busy_timeout_ms = 50;
  auto store = Store::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  auto holder = RawDb();
  Transaction txn(holder.get());
  ASSERT_TRUE(txn.Begin().ok());
  auto lease = (*store)->LeaseTask("w", "cpu", 1000);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lease.status().message(), HasSubstr("busy timeout"));
  ASSERT_TRUE(txn.Commit().ok());
  EXPECT_TRUE((*store)->LeaseTask("w", "cpu", 1000).ok());
}

TEST_F(StoreTest, StoresOpeningAnEmptyDirAtOnceMigrateItOnce) {
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([this, i, &results] {
      Store::Options options;
      options.data_dir = DataDir();
      results[i] = Store::Open(options).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(*RawDb()->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(*RawDb()->QueryInt("SELECT COUNT(*) FROM meta"), 1);
}

// Two Store objects are two connections, as two server processes would
// have; four threads lease from them at once and no task is handed out twice.
TEST_F(StoreTest, ConcurrentLeasesOnTwoConnectionsNeverShareATask) {
  constexpr int kTasks = 120;
  auto a = OpenStore();
  auto b = OpenStore();
  PutModel(*a);
  const std::string job_id = NewJob(*a).job_id();
  for (int i = 0; i < kTasks; ++i) NewTask(*a, job_id, i + 1);

  absl::Mutex mu;
  std::vector<std::string> leased;
  std::vector<std::string> errors;
  auto worker = [&](Store* store, std::string name) {
    while (true) {
      auto task = store->LeaseTask(name, "cpu", 60'000);
      if (!task.ok()) {
        absl::MutexLock lock(&mu);
        errors.push_back(task.status().ToString());
        return;
      }
      if (!task->has_value()) return;
      auto done = store->CompleteTask((*task)->task_id(),
                                      (*task)->fence_token(), name, name);
      absl::MutexLock lock(&mu);
      if (!done.ok() || !*done) errors.push_back(done.status().ToString());
      leased.push_back((*task)->task_id());
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(worker, a.get(), "a1");
  threads.emplace_back(worker, a.get(), "a2");
  threads.emplace_back(worker, b.get(), "b1");
  threads.emplace_back(worker, b.get(), "b2");
  for (std::thread& t : threads) t.join();

  EXPECT_THAT(errors, SizeIs(0)) << (errors.empty() ? "" : errors[0]);
  EXPECT_EQ(leased.size(), static_cast<size_t>(kTasks));
  EXPECT_EQ(std::set<std::string>(leased.begin(), leased.end()).size(),
            static_cast<size_t>(kTasks));
  EXPECT_EQ((*b->CountTasksByState())[v1::Task::DONE], kTasks);
  EXPECT_EQ(*RawDb()->QueryInt("SELECT COUNT(*) FROM task_results"), kTasks);
}

// ---------------------------------------------------------------------------
// Profiles, schedule cache, validations
// ---------------------------------------------------------------------------

TEST_F(StoreTest, ProfilesAreStoredPerJobAndBatchSize) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  v1::Profile profile;
  profile.set_batch_size(8);
  profile.mutable_measured()->set_peak_bytes(1 << 20);
  ASSERT_TRUE(store->PutProfile(job_id, 8, profile).ok());
  profile.mutable_measured()->set_peak_bytes(2 << 20);  // a re-profile
  ASSERT_TRUE(store->PutProfile(job_id, 8, profile).ok());
  EXPECT_EQ(store->GetProfile(job_id, 8)->measured().peak_bytes(), 2 << 20);
  auto missing = store->GetProfile(job_id, 16);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("batch size 16"));
  EXPECT_EQ(store->PutProfile("job-nope", 8, profile).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, ProfileDeviceIsReadWithoutTheWholeProfile) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  v1::Profile profile;
  profile.mutable_device()->set_name("NVIDIA H100 80GB HBM3");
  profile.mutable_device()->set_libtorch_version("2.11.0");
  ASSERT_TRUE(store->PutProfile(job_id, 8, profile).ok());
  auto device = store->GetProfileDevice(job_id, 8);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(device->name(), "NVIDIA H100 80GB HBM3");
  // A row written before the device column existed: read from the profile.
  ASSERT_TRUE(RawDb()->Exec("UPDATE profiles SET device = NULL").ok());
  EXPECT_EQ(store->GetProfileDevice(job_id, 8)->libtorch_version(), "2.11.0");
  EXPECT_EQ(store->GetProfileDevice(job_id, 16).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, ScheduleCacheHitsOnlyForTheSameKey) {
  auto store = OpenStore();
  v1::DeviceInfo device;
  device.set_kind("cuda");
  device.set_name("NVIDIA H100 80GB HBM3");
  device.set_total_bytes(int64_t{80} << 30);
  device.set_libtorch_version("2.11.0");
  const ScheduleCacheKey key =
      MakeScheduleCacheKey(Spec(), 32, device, *ParseBudget("60%"), v1::MUTWO);
  EXPECT_FALSE(store->GetCachedSchedule(key)->has_value());

  v1::Schedule schedule;
  schedule.set_predicted_peak_bytes(42);
  schedule.set_feasible(true);
  ASSERT_TRUE(store->PutSchedule(key, "job-1", schedule).ok());
  // Another spelling of the same budget hits the same entry.
  const ScheduleCacheKey same = MakeScheduleCacheKey(
      Spec(), 32, device, *ParseBudget("60.0%"), v1::POLICY_UNSPECIFIED);
  auto hit = store->GetCachedSchedule(same);
  ASSERT_TRUE(hit.ok() && hit->has_value()) << hit.status();
  EXPECT_EQ((*hit)->predicted_peak_bytes(), 42);

  ScheduleCacheKey other_batch = key;
  other_batch.batch_size = 64;
  ScheduleCacheKey other_budget = key;
  other_budget.budget = *ParseBudget("50%");
  ScheduleCacheKey other_torch = key;
  other_torch.libtorch_version = "1.13.1";
  ScheduleCacheKey other_planner = key;
  other_planner.planner_version = "mutwo-planner-0";
  ScheduleCacheKey other_policy = key;
  other_policy.policy = v1::SQRT_N;
  for (const ScheduleCacheKey* miss :
       {&other_batch, &other_budget, &other_torch, &other_planner,
        &other_policy}) {
    EXPECT_FALSE(store->GetCachedSchedule(*miss)->has_value())
        << CanonicalKeyString(*miss);
  }
  ScheduleCacheKey invalid = key;
  invalid.libtorch_version.clear();
  EXPECT_EQ(store->GetCachedSchedule(invalid).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, ValidationsAreListedByBatchSize) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  v1::Validation v;
  v.set_within_budget(true);
  ASSERT_TRUE(store->PutValidation(job_id, 16, "60%", 1, v).ok());
  ASSERT_TRUE(store->PutValidation(job_id, 8, "4GiB", 1, v).ok());
  v.set_within_budget(false);
  ASSERT_TRUE(store->PutValidation(job_id, 8, "60%", 1, v).ok());
  ASSERT_TRUE(store->PutValidation(job_id, 8, "4GiB", 1, v).ok());  // replaces
  // A second round of the closed loop is kept next to the first.
  v.set_within_budget(true);
  ASSERT_TRUE(store->PutValidation(job_id, 8, "4GiB", 2, v).ok());
  EXPECT_EQ(store->PutValidation(job_id, 8, "4GiB", 0, v).code(),
            absl::StatusCode::kInvalidArgument);
  auto records = store->ListValidations(job_id);
  ASSERT_THAT(*records, SizeIs(4));
  EXPECT_EQ((*records)[0].batch_size, 8);
  EXPECT_EQ((*records)[0].budget_text, "4GiB");
  EXPECT_EQ((*records)[0].round, 1);
  EXPECT_FALSE((*records)[0].validation.within_budget());
  EXPECT_EQ((*records)[1].budget_text, "60%");
  EXPECT_EQ((*records)[2].budget_text, "4GiB");
  EXPECT_EQ((*records)[2].round, 2);
  EXPECT_TRUE((*records)[2].validation.within_budget());
  EXPECT_EQ((*records)[3].batch_size, 16);
  EXPECT_TRUE((*records)[3].validation.within_budget());
}

// ---------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------

TEST_F(StoreTest, WorkersBecomeLostAfterMissedHeartbeats) {
  auto store = OpenStore();
  v1::WorkerInfo info;
  info.set_hostname("host-a");
  info.mutable_device()->set_kind("cpu");
  auto registered = store->UpsertWorker(info, "");
  ASSERT_TRUE(registered.ok()) << registered.status();
  const std::string id = registered->worker_id();
  EXPECT_THAT(id, ::testing::StartsWith("worker-"));
  EXPECT_EQ(registered->state(), v1::WorkerInfo::IDLE);
  const std::string other = store->UpsertWorker(info, "")->worker_id();
  EXPECT_NE(other, id);

  now_ms_ += 20'000;
  ASSERT_TRUE(store->TouchWorker(id, v1::WorkerInfo::BUSY, "task-1").ok());
  now_ms_ += 20'000;  // `other` silent for 40 s, `id` for 20 s
  auto lost = store->MarkLostWorkers(30'000);
  ASSERT_THAT(*lost, SizeIs(1));
  EXPECT_EQ((*lost)[0].worker_id(), other);
  EXPECT_THAT(*store->MarkLostWorkers(30'000), SizeIs(0));  // once
  const std::vector<v1::WorkerInfo> workers = *store->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  for (const v1::WorkerInfo& w : workers) {
    EXPECT_EQ(w.state(), w.worker_id() == id ? v1::WorkerInfo::BUSY
                                             : v1::WorkerInfo::LOST);
    EXPECT_EQ(w.hostname(), "host-a");
    if (w.worker_id() == id) EXPECT_EQ(w.current_task_id(), "task-1");
  }
  // A lost worker that registers again is alive.
  v1::WorkerInfo back = info;
  back.set_worker_id(other);
  EXPECT_EQ(store->UpsertWorker(back, "")->state(), v1::WorkerInfo::IDLE);
  auto unknown = store->TouchWorker("worker-x", v1::WorkerInfo::IDLE, "");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("worker-x"));
}

// ---------------------------------------------------------------------------
// Identities: owners, uploaders, worker principals, lease holders
// ---------------------------------------------------------------------------

TEST_F(StoreTest, JobsKeepTheirOwnerAndListByOwner) {
  auto store = OpenStore();
  PutModel(*store);
  const v1::Job alice = store->CreateJob(Spec(), "", "alice")->job;
  const v1::Job bob = store->CreateJob(Spec(), "", "bob")->job;
  EXPECT_EQ(alice.owner(), "alice");
  EXPECT_EQ(*store->GetJobOwner(alice.job_id()), "alice");
  EXPECT_EQ(store->GetJob(bob.job_id())->owner(), "bob");
  // An update never changes the owner.
  auto updated = store->UpdateJob(alice.job_id(), [](v1::Job& j) {
    j.set_owner("mallory");
    return absl::OkStatus();
  });
  ASSERT_TRUE(updated.ok());
  EXPECT_EQ(updated->owner(), "alice");
  EXPECT_EQ(store->GetJobOwner("job-nope").status().code(),
            absl::StatusCode::kNotFound);
  ListJobsQuery query;
  query.owner = "bob";
  auto page = store->ListJobs(query);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(1));
  EXPECT_EQ(page->jobs[0].job_id(), bob.job_id());
  query.owner.reset();
  EXPECT_THAT(store->ListJobs(query)->jobs, SizeIs(2));
}

TEST_F(StoreTest, RequestIdsDeduplicatePerOwner) {
  auto store = OpenStore();
  PutModel(*store);
  auto first = store->CreateJob(Spec(), "req", "alice");
  auto other = store->CreateJob(Spec(), "req", "bob");
  auto again = store->CreateJob(Spec(), "req", "alice");
  ASSERT_TRUE(first.ok() && other.ok() && again.ok());
  EXPECT_FALSE(other->deduplicated);
  EXPECT_NE(other->job.job_id(), first->job.job_id());
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->job.job_id(), first->job.job_id());
}

TEST_F(StoreTest, ModelUploadsAreRecordedPerPrincipal) {
  auto store = OpenStore();
  PutModel(*store);
  EXPECT_FALSE(*store->HasUploadedModel(kSha, "alice"));
  ASSERT_TRUE(store->RecordModelUpload(kSha, "alice").ok());
  ASSERT_TRUE(store->RecordModelUpload(kSha, "alice").ok());  // idempotent
  EXPECT_TRUE(*store->HasUploadedModel(kSha, "alice"));
  EXPECT_FALSE(*store->HasUploadedModel(kSha, "bob"));
  EXPECT_FALSE(*store->HasUploadedModel(kOtherSha, "alice"));
}

// The per-principal quota's figure: each uploader is charged every model it
// uploaded, once, whoever else uploaded the same bytes.
TEST_F(StoreTest, ModelBytesAreChargedToEachUploaderOnce) {
  auto store = OpenStore();
  PutModel(*store);  // 5 bytes
  ASSERT_TRUE(store->PutModel(kOtherSha, "other", 7, "other b").ok());
  EXPECT_EQ(*store->ModelBytesUploadedBy("alice"), 0);
  ASSERT_TRUE(store->RecordModelUpload(kSha, "alice").ok());
  ASSERT_TRUE(store->RecordModelUpload(kSha, "alice").ok());
  ASSERT_TRUE(store->RecordModelUpload(kOtherSha, "alice").ok());
  ASSERT_TRUE(store->RecordModelUpload(kSha, "bob").ok());
  EXPECT_EQ(*store->ModelBytesUploadedBy("alice"), 12);
  EXPECT_EQ(*store->ModelBytesUploadedBy("bob"), 5);
  EXPECT_EQ(*store->ModelBytesUploadedBy("carol"), 0);
}

TEST_F(StoreTest, AWorkerIdStaysWithItsPrincipalWhileAlive) {
  auto store = OpenStore();
  v1::WorkerInfo info;
  info.mutable_device()->set_kind("cpu");
  const std::string id = store->UpsertWorker(info, "w1")->worker_id();
  EXPECT_EQ(*store->GetWorkerPrincipal(id), "w1");
  info.set_worker_id(id);
  auto stolen = store->UpsertWorker(info, "w2");
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(*store->GetWorkerPrincipal(id), "w1");
  EXPECT_TRUE(store->UpsertWorker(info, "w1").ok());
  // Once LOST, the id may be taken over (the old process is gone).
  now_ms_ += 10'000;
  ASSERT_THAT(*store->MarkLostWorkers(1000), SizeIs(1));
  EXPECT_TRUE(store->UpsertWorker(info, "w2").ok());
  EXPECT_EQ(*store->GetWorkerPrincipal(id), "w2");
  EXPECT_EQ(store->GetWorkerPrincipal("worker-nope").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, AFenceIsBoundToTheWorkerHoldingTheLease) {
  auto store = OpenStore();
  PutModel(*store);
  const std::string job_id = NewJob(*store).job_id();
  NewTask(*store, job_id);
  const v1::Task task = **store->LeaseTask("holder", "cpu", 10'000);
  const int64_t fence = task.fence_token();
  // The right fence from another worker: refused, and nothing changes.
  EXPECT_EQ(
      store->ExtendLease(task.task_id(), fence, "thief", 1000).status().code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store->CompleteTask(task.task_id(), fence, "thief", "forged")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store->FailTask(task.task_id(), fence, "thief", "x", false, 3)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store->GetTask(task.task_id())->state(), v1::Task::LEASED);
  ASSERT_TRUE(*store->CompleteTask(task.task_id(), fence, "holder", "real"));
  EXPECT_EQ(*store->GetTaskResult(task.task_id()), "real");
  // A retry by the holder is a no-op; the same fence from another worker is
  // not taken for a retry.
  EXPECT_FALSE(*store->CompleteTask(task.task_id(), fence, "holder", "real"));
  EXPECT_FALSE(store->CompleteTask(task.task_id(), fence, "thief", "x").ok());
}

TEST_F(StoreTest, HoldsLeaseOnModelOnlyForTheLeasingPrincipal) {
  auto store = OpenStore();
  PutModel(*store);
  v1::WorkerInfo info;
  info.mutable_device()->set_kind("cpu");
  const std::string w1 = store->UpsertWorker(info, "p1")->worker_id();
  store->UpsertWorker(info, "p2").IgnoreError();
  const std::string job_id = NewJob(*store).job_id();
  NewTask(*store, job_id);
  EXPECT_FALSE(*store->HoldsLeaseOnModel("p1", kSha));  // queued, not leased
  const v1::Task task = **store->LeaseTask(w1, "cpu", 10'000);
  EXPECT_TRUE(*store->HoldsLeaseOnModel("p1", kSha));
  EXPECT_FALSE(*store->HoldsLeaseOnModel("p2", kSha));
  EXPECT_FALSE(*store->HoldsLeaseOnModel("p1", kOtherSha));
  ASSERT_TRUE(*store->CompleteTask(task.task_id(), task.fence_token(), w1, ""));
  EXPECT_FALSE(*store->HoldsLeaseOnModel("p1", kSha));  // done: no lease
}

}  // namespace
}  // namespace mutwo::storage

namespace mutwo::storage {
namespace {

// A database written by schema version 4 (profiles and cache entries
// without measurements) opens at version 5 with nothing lost: the old
// entry and profile are still there, the entry records no digest or worker,
// the profile has no measurement row.
TEST_F(StoreTest, Version4DatabaseMigratesKeepingProfilesAndCacheEntries) {
  std::filesystem::create_directories(DataDir());
  {
    auto db = RawDb();
    for (const Migration& m : Migrations()) {
      if (m.version > 4) break;
      ASSERT_TRUE(db->Exec(m.sql).ok()) << m.version;
    }
    ASSERT_TRUE(db->Exec("PRAGMA user_version = 4").ok());
    ASSERT_TRUE(db->Exec("INSERT INTO jobs (job_id, state, model_sha256, "
                         "client_request_id, created_unix_ms, "
                         "updated_unix_ms, job) VALUES ('job-old', 1, 'm', "
                         "'', 0, 0, x'')")
                    .ok());
    ASSERT_TRUE(db->Exec("INSERT INTO profiles (job_id, batch_size, "
                         "graph_fingerprint, profile, updated_unix_ms) "
                         "VALUES ('job-old', 8, 'fp', x'', 0)")
                    .ok());
    ASSERT_TRUE(db->Exec("INSERT INTO schedules (cache_key, model_sha256, "
                         "batch_size, job_id, schedule, created_unix_ms) "
                         "VALUES ('old-key', 'm', 8, 'job-old', x'', 0)")
                    .ok());
  }
  std::unique_ptr<Store> store = OpenStore();
  auto db = RawDb();
  EXPECT_EQ(*db->QueryInt("PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM schedules WHERE cache_key = "
                          "'old-key' AND profile_sha256 = '' AND "
                          "measured_by = ''"),
            1);
  EXPECT_EQ(*db->QueryInt("SELECT COUNT(*) FROM profiles"), 1);
  auto measurement = store->GetProfileMeasurement("job-old", 8);
  ASSERT_TRUE(measurement.ok()) << measurement.status();
  EXPECT_FALSE(measurement->has_value());
}

TEST_F(StoreTest, ProfileMeasurementsAreListedByKey) {
  std::unique_ptr<Store> store = OpenStore();
  PutModel(*store);
  auto a = store->CreateJob(Spec(), "", "alice");
  auto b = store->CreateJob(Spec(), "", "bob");
  ASSERT_TRUE(a.ok() && b.ok());
  ProfileMeasurement m;
  m.batch_size = 8;
  m.measurement_key = "key-1";
  m.profile_sha256 = std::string(64, 'a');
  m.worker_id = "worker-1";
  m.worker_principal = "w1";
  m.peak_bytes = 1000;
  m.job_id = a->job.job_id();
  m.tenant = "alice";
  ASSERT_TRUE(store->PutProfileMeasurement(m).ok());
  m.job_id = b->job.job_id();
  m.tenant = "bob";
  m.flag = "disagrees";
  m.peak_bytes = 10;
  ASSERT_TRUE(store->PutProfileMeasurement(m).ok());
  m.profile_sha256 = "not a digest";
  EXPECT_EQ(store->PutProfileMeasurement(m).code(),
            absl::StatusCode::kInvalidArgument);
  auto rows = store->ListProfileMeasurements("key-1");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].tenant, "alice");
  EXPECT_EQ((*rows)[0].peak_bytes, 1000);
  EXPECT_EQ((*rows)[1].flag, "disagrees");
  EXPECT_TRUE(store->ListProfileMeasurements("key-2")->empty());
  auto one = store->GetProfileMeasurement(b->job.job_id(), 8);
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_EQ((*one)->worker_principal, "w1");
}

}  // namespace
}  // namespace mutwo::storage
