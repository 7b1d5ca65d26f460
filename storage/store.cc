// The Store itself: opening the database, transactions and the two ways
// of running a write (StoreWrites). Each aggregate's operations are in a
// file of their own: store_models.cc, store_jobs.cc, store_tasks.cc,
// store_profiles.cc, store_schedules.cc, store_workers.cc.
#include "storage/store.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "storage/durable_file.h"
#include "storage/schema.h"
#include "storage/store_rows.h"

namespace mutwo::storage {
namespace {

constexpr char kDbFile[] = "mutwo.db";

// Switching a new file to WAL needs an exclusive lock, and SQLite answers
// SQLITE_BUSY at once (the busy handler is not called there) while another
// connection opens or migrates the same file; so two stores opening one
// empty data_dir together retry, with jittered backoff, until the busy
// timeout.
absl::StatusOr<std::string> SetWalMode(Db* db, int busy_timeout_ms) {
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(std::max(busy_timeout_ms, 100));
  thread_local std::mt19937 rng(std::random_device{}());
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<std::string> mode = db->QueryText("PRAGMA journal_mode=WAL");
    if (mode.ok() || !absl::IsUnavailable(mode.status()) ||
        absl::Now() >= deadline) {
      return mode;
    }
    std::uniform_int_distribution<int64_t> jitter(
        0, absl::ToInt64Microseconds(backoff));
    absl::SleepFor(backoff + absl::Microseconds(jitter(rng)));
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(Options options) {
  if (options.data_dir.empty()) {
    return absl::InvalidArgumentError("store: empty data_dir");
  }
  if (options.busy_timeout_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store: busy_timeout_ms must be >= 0, got ", options.busy_timeout_ms));
  }
  while (options.data_dir.size() > 1 && options.data_dir.back() == '/') {
    options.data_dir.pop_back();
  }
  if (!options.now_ms) {
    options.now_ms = [] { return absl::ToUnixMillis(absl::Now()); };
  }
  const std::string models_dir =
      absl::StrCat(options.data_dir, "/", kModelsDir);
  MUTWO_RETURN_IF_ERROR(MakeDirs(options.data_dir));
  MUTWO_RETURN_IF_ERROR(MakeDirs(models_dir));
  MUTWO_RETURN_IF_ERROR(
      RemoveStaleTempFiles(models_dir, kStaleTempFileAgeMs).status());

  MUTWO_ASSIGN_OR_RETURN(std::unique_ptr<Db> db,
                         Db::Open(absl::StrCat(options.data_dir, "/", kDbFile),
                                  options.busy_timeout_ms));
  MUTWO_ASSIGN_OR_RETURN(std::string journal,
                         SetWalMode(db.get(), options.busy_timeout_ms));
  if (absl::AsciiStrToLower(journal) != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat("store: ", db->path(), " cannot use WAL (journal mode ",
                     journal, "); put --data_dir on a local file system"));
  }
  MUTWO_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL"));
  MUTWO_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  MUTWO_RETURN_IF_ERROR(Migrate(db.get()));
  return std::unique_ptr<Store>(new Store(std::move(options), std::move(db)));
}

Store::Store(Options options, std::unique_ptr<Db> db)
    : StoreWrites(this), options_(std::move(options)), db_(std::move(db)) {}

Store::~Store() = default;

absl::Status Store::FaultPoint(absl::string_view step) const {
  return options_.fault_hook ? options_.fault_hook(step) : absl::OkStatus();
}

absl::Status Store::InTransaction(const std::function<absl::Status()>& body) {
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_RETURN_IF_ERROR(body());
  return txn.Commit();
}

absl::Status Store::Write(
    const std::function<absl::Status(Writer& writer)>& body) {
  return InTransaction([&]() -> absl::Status {
    Writer writer(this);
    MUTWO_RETURN_IF_ERROR(body(writer));
    return FaultPoint("commit");
  });
}

absl::StatusOr<std::optional<Store::BlobRow>> Store::QueryBlob(
    const std::string& sql, const std::function<void(Stmt&)>& bind) {
  absl::MutexLock lock(&mutex_);
  return QueryRow<BlobRow>(
      *db_, sql, bind, [](const Stmt& stmt) -> absl::StatusOr<BlobRow> {
        return BlobRow{stmt.ColumnBlob(0),
                       stmt.ColumnCount() > 1 && stmt.ColumnInt(1) != 0};
      });
}

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> Store::CountStates(
    absl::string_view table) {
  absl::MutexLock lock(&mutex_);
  return QueryRows<std::pair<int64_t, int64_t>>(
      *db_,
      absl::StrCat("SELECT state, COUNT(*) FROM ", table, " GROUP BY state"),
      nullptr,
      [](const Stmt& stmt) -> absl::StatusOr<std::pair<int64_t, int64_t>> {
        return std::make_pair(stmt.ColumnInt(0), stmt.ColumnInt(1));
      });
}

absl::Status Store::RunWrite(absl::string_view /*step*/,
                             const std::function<absl::Status()>& op) {
  return InTransaction(op);
}

absl::Status Store::RunRead(const std::function<absl::Status()>& op) {
  absl::MutexLock lock(&mutex_);
  return op();
}

absl::Status Store::Writer::RunWrite(absl::string_view step,
                                     const std::function<absl::Status()>& op) {
  MUTWO_RETURN_IF_ERROR(store().FaultPoint(step));
  store().mutex_.AssertHeld();
  return op();
}

absl::Status Store::Writer::RunRead(const std::function<absl::Status()>& op) {
  store().mutex_.AssertHeld();
  return op();
}

// ---------------------------------------------------------------------------
// StoreWrites: each operation once, run by the Store or by a Writer
// ---------------------------------------------------------------------------

template <typename T>
absl::StatusOr<T> StoreWrites::Write(
    absl::string_view step, const std::function<absl::StatusOr<T>()>& op) {
  std::optional<T> result;
  MUTWO_RETURN_IF_ERROR(RunWrite(step, [&]() -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(result, op());
    return absl::OkStatus();
  }));
  return *std::move(result);
}

template <typename T>
absl::StatusOr<T> StoreWrites::Read(
    const std::function<absl::StatusOr<T>()>& op) {
  std::optional<T> result;
  MUTWO_RETURN_IF_ERROR(RunRead([&]() -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(result, op());
    return absl::OkStatus();
  }));
  return *std::move(result);
}

absl::StatusOr<CreateJobResult> StoreWrites::CreateJob(
    const v1::JobSpec& spec, absl::string_view client_request_id,
    absl::string_view owner, int64_t max_unfinished_jobs) {
  return Write<CreateJobResult>("CreateJob", [&] {
    return store_->CreateJobLocked(spec, client_request_id, owner,
                                   max_unfinished_jobs);
  });
}

absl::StatusOr<v1::Job> StoreWrites::UpdateJob(
    absl::string_view job_id,
    const std::function<absl::Status(v1::Job&)>& mutate) {
  return Write<v1::Job>(
      "UpdateJob", [&] { return store_->UpdateJobLocked(job_id, mutate); });
}

absl::StatusOr<v1::Task> StoreWrites::AddTask(
    absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
    const std::optional<v1::Schedule>& schedule) {
  // (AddTaskLocked checks the kind, batch size and schedule.)
  return Write<v1::Task>("AddTask", [&] {
    return store_->AddTaskLocked(job_id, kind, batch_size, schedule);
  });
}

absl::StatusOr<bool> StoreWrites::CompleteTask(absl::string_view task_id,
                                               int64_t fence_token,
                                               absl::string_view worker_id,
                                               absl::string_view result) {
  return Write<bool>("CompleteTask", [&] {
    return store_->CompleteTaskLocked(task_id, fence_token, worker_id, result);
  });
}

absl::StatusOr<v1::Task> StoreWrites::FailTask(
    absl::string_view task_id, int64_t fence_token, absl::string_view worker_id,
    absl::string_view reason, bool retryable, int max_attempts) {
  return Write<v1::Task>("FailTask", [&] {
    return store_->FailTaskLocked(task_id, fence_token, worker_id, reason,
                                  retryable, max_attempts);
  });
}

absl::StatusOr<int64_t> StoreWrites::CancelJobTasks(absl::string_view job_id) {
  return Write<int64_t>("CancelJobTasks",
                        [&] { return store_->CancelJobTasksLocked(job_id); });
}

absl::StatusOr<v1::Task> StoreWrites::GetTask(absl::string_view task_id) {
  return Read<v1::Task>([&] { return store_->GetTaskLocked(task_id); });
}

absl::StatusOr<std::vector<v1::Task>> StoreWrites::ListTasks(
    absl::string_view job_id) {
  return Read<std::vector<v1::Task>>(
      [&] { return store_->ListTasksLocked(job_id); });
}

absl::Status StoreWrites::PutProfile(absl::string_view job_id,
                                     int64_t batch_size,
                                     const v1::Profile& profile) {
  return RunWrite("PutProfile", [&] {
    return store_->PutProfileLocked(job_id, batch_size, profile);
  });
}

absl::Status StoreWrites::PutProfileMeasurement(
    const ProfileMeasurement& measurement) {
  return RunWrite("PutProfileMeasurement", [&] {
    return store_->PutProfileMeasurementLocked(measurement);
  });
}

absl::StatusOr<std::vector<ProfileMeasurement>>
StoreWrites::ListProfileMeasurements(absl::string_view measurement_key) {
  return Read<std::vector<ProfileMeasurement>>([&] {
    return store_->ListProfileMeasurementsLocked(measurement_key, "", 0);
  });
}

absl::Status StoreWrites::PutValidation(absl::string_view job_id,
                                        int64_t batch_size,
                                        absl::string_view budget_text,
                                        int round,
                                        const v1::Validation& validation) {
  return RunWrite("PutValidation", [&] {
    return store_->PutValidationLocked(job_id, batch_size, budget_text, round,
                                       validation);
  });
}

}  // namespace mutwo::storage
