#include "storage/store.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "storage/durable_file.h"
#include "storage/schema.h"

namespace mutwo::storage {
namespace {

constexpr char kDbFile[] = "mutwo.db";
constexpr char kModelsDir[] = "models";
constexpr char kPageTokenPrefix[] = "jobs-before:";

constexpr char kTaskColumns[] =
    "task_id, job_id, kind, state, batch_size, attempt, fence_token, "
    "lease_owner, lease_expiry_unix_ms, last_error, schedule";
constexpr char kWorkerColumns[] =
    "worker_id, state, last_heartbeat_unix_ms, current_task_id, info";

std::string Quote(absl::string_view text) {
  return absl::StrCat("\"", text, "\"");
}

absl::Status ValidateSha256(absl::string_view sha256) {
  bool ok = sha256.size() == 64;
  for (char c : sha256) {
    ok = ok && (absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("model sha256 ", Quote(sha256.substr(0, 80)),
                     ": expected 64 lowercase hex digits"));
  }
  return absl::OkStatus();
}

absl::Status RequireNonEmpty(absl::string_view value, absl::string_view what) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("empty ", what));
  }
  return absl::OkStatus();
}

// Sortable unique ids: the creation time zero-padded, then random bits so
// that ids made in the same millisecond (or by another process) differ.
std::string NewId(absl::string_view prefix, int64_t now_ms) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s-%013d-%012x", prefix, now_ms,
                         rng() & 0xffffffffffffULL);
}

template <typename Proto>
absl::StatusOr<Proto> ParseRow(const std::string& blob,
                               absl::string_view what) {
  Proto proto;
  if (!proto.ParseFromString(blob)) {
    return absl::DataLossError(
        absl::StrCat(what, ": stored ", Proto::descriptor()->name(),
                     " does not parse (corrupt row, ", blob.size(), " bytes)"));
  }
  return proto;
}

absl::StatusOr<v1::Job> JobFromRow(const Stmt& stmt) {
  const std::string job_id = stmt.ColumnText(0);
  MUTWO_ASSIGN_OR_RETURN(
      v1::Job job,
      ParseRow<v1::Job>(stmt.ColumnBlob(1), absl::StrCat("job ", job_id)));
  if (job.job_id() != job_id) {
    return absl::DataLossError(absl::StrCat(
        "job ", job_id, ": stored proto names job ", Quote(job.job_id())));
  }
  return job;
}

absl::StatusOr<v1::Task> TaskFromRow(const Stmt& stmt) {
  v1::Task task;
  task.set_task_id(stmt.ColumnText(0));
  task.set_job_id(stmt.ColumnText(1));
  const int64_t kind = stmt.ColumnInt(2);
  const int64_t state = stmt.ColumnInt(3);
  if (!v1::Task::Kind_IsValid(static_cast<int>(kind)) ||
      !v1::Task::State_IsValid(static_cast<int>(state))) {
    return absl::DataLossError(
        absl::StrCat("task ", task.task_id(), ": stored kind ", kind,
                     " or state ", state, " is not a valid value"));
  }
  task.set_kind(static_cast<v1::Task::Kind>(kind));
  task.set_state(static_cast<v1::Task::State>(state));
  task.set_batch_size(stmt.ColumnInt(4));
  task.set_attempt(static_cast<int32_t>(stmt.ColumnInt(5)));
  task.set_fence_token(stmt.ColumnInt(6));
  task.set_lease_owner(stmt.ColumnText(7));
  task.set_lease_expiry_unix_ms(stmt.ColumnInt(8));
  task.set_last_error(stmt.ColumnText(9));
  if (!stmt.ColumnIsNull(10)) {
    MUTWO_ASSIGN_OR_RETURN(
        *task.mutable_schedule(),
        ParseRow<v1::Schedule>(stmt.ColumnBlob(10),
                               absl::StrCat("task ", task.task_id())));
  }
  return task;
}

absl::StatusOr<v1::WorkerInfo> WorkerFromRow(const Stmt& stmt) {
  const std::string worker_id = stmt.ColumnText(0);
  MUTWO_ASSIGN_OR_RETURN(
      v1::WorkerInfo worker,
      ParseRow<v1::WorkerInfo>(stmt.ColumnBlob(4),
                               absl::StrCat("worker ", worker_id)));
  const int64_t state = stmt.ColumnInt(1);
  if (!v1::WorkerInfo::State_IsValid(static_cast<int>(state))) {
    return absl::DataLossError(absl::StrCat(
        "worker ", worker_id, ": stored state ", state, " is not valid"));
  }
  // The columns are the live state; the blob holds the registration facts.
  worker.set_worker_id(worker_id);
  worker.set_state(static_cast<v1::WorkerInfo::State>(state));
  worker.set_last_heartbeat_unix_ms(stmt.ColumnInt(2));
  worker.set_current_task_id(stmt.ColumnText(3));
  return worker;
}

std::string EncodePageToken(int64_t seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, seq));
}

absl::StatusOr<int64_t> DecodePageToken(absl::string_view token) {
  std::string decoded;
  absl::string_view rest;
  int64_t seq = 0;
  if (absl::WebSafeBase64Unescape(token, &decoded)) {
    rest = decoded;
  }
  if (!absl::ConsumePrefix(&rest, kPageTokenPrefix) ||
      !absl::SimpleAtoi(rest, &seq) || seq <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page token ", Quote(token.substr(0, 80)),
                     " is not one returned by ListJobs"));
  }
  return seq;
}

bool IsFinished(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED ||
         state == v1::Job::CANCELLED;
}

absl::Status ValidateLeaseMs(int64_t lease_ms) {
  if (lease_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ms must be positive, got ", lease_ms));
  }
  return absl::OkStatus();
}

absl::Status ValidateMaxAttempts(int max_attempts) {
  if (max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts must be at least 1, got ", max_attempts));
  }
  return absl::OkStatus();
}

absl::Status ValidateBatchSize(int64_t batch_size) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be positive, got ", batch_size));
  }
  return absl::OkStatus();
}

// Counts per state from (state, count) rows, with every valid state except
// the unspecified one present (zero when no row has it). DataLoss for a
// state the enum does not have.
template <typename State>
absl::StatusOr<std::map<State, int64_t>> StateCounts(
    const std::vector<std::pair<int64_t, int64_t>>& rows,
    absl::string_view table, bool (*is_valid)(int), int min, int max) {
  std::map<State, int64_t> counts;
  for (int s = min; s <= max; ++s) {
    if (is_valid(s) && s != 0) counts[static_cast<State>(s)] = 0;
  }
  for (const auto& [state, count] : rows) {
    if (!is_valid(static_cast<int>(state))) {
      return absl::DataLossError(
          absl::StrCat(table, " table holds an invalid state ", state));
    }
    counts[static_cast<State>(state)] = count;
  }
  return counts;
}

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
    : options_(std::move(options)), db_(std::move(db)) {}

Store::~Store() = default;

absl::Status Store::FaultPoint(absl::string_view step) const {
  return options_.fault_hook ? options_.fault_hook(step) : absl::OkStatus();
}

template <typename T>
absl::StatusOr<T> Store::InTransaction(
    const std::function<absl::StatusOr<T>()>& body) {
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(T result, body());
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return result;
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

// ---------------------------------------------------------------------------
// Writer: the Store's writes inside a Write (mutex held, transaction open)
// ---------------------------------------------------------------------------

absl::StatusOr<CreateJobResult> Store::Writer::CreateJob(
    const v1::JobSpec& spec, absl::string_view client_request_id,
    absl::string_view owner, int64_t max_unfinished_jobs) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("CreateJob"));
  store_->mutex_.AssertHeld();
  return store_->CreateJobLocked(spec, client_request_id, owner,
                                 max_unfinished_jobs);
}

absl::StatusOr<v1::Job> Store::Writer::UpdateJob(
    absl::string_view job_id,
    const std::function<absl::Status(v1::Job&)>& mutate) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("UpdateJob"));
  store_->mutex_.AssertHeld();
  return store_->UpdateJobLocked(job_id, mutate);
}

absl::StatusOr<v1::Task> Store::Writer::AddTask(
    absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
    const std::optional<v1::Schedule>& schedule) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("AddTask"));
  store_->mutex_.AssertHeld();
  return store_->AddTaskLocked(job_id, kind, batch_size, schedule);
}

absl::StatusOr<bool> Store::Writer::CompleteTask(absl::string_view task_id,
                                                 int64_t fence_token,
                                                 absl::string_view worker_id,
                                                 absl::string_view result) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("CompleteTask"));
  store_->mutex_.AssertHeld();
  return store_->CompleteTaskLocked(task_id, fence_token, worker_id, result);
}

absl::StatusOr<v1::Task> Store::Writer::FailTask(
    absl::string_view task_id, int64_t fence_token, absl::string_view worker_id,
    absl::string_view reason, bool retryable, int max_attempts) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("FailTask"));
  store_->mutex_.AssertHeld();
  return store_->FailTaskLocked(task_id, fence_token, worker_id, reason,
                                retryable, max_attempts);
}

absl::StatusOr<int64_t> Store::Writer::CancelJobTasks(
    absl::string_view job_id) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("CancelJobTasks"));
  store_->mutex_.AssertHeld();
  return store_->CancelJobTasksLocked(job_id);
}

absl::Status Store::Writer::PutProfile(absl::string_view job_id,
                                       int64_t batch_size,
                                       const v1::Profile& profile) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("PutProfile"));
  store_->mutex_.AssertHeld();
  return store_->PutProfileLocked(job_id, batch_size, profile);
}

absl::Status Store::Writer::PutValidation(absl::string_view job_id,
                                          int64_t batch_size,
                                          absl::string_view budget_text,
                                          int round,
                                          const v1::Validation& validation) {
  MUTWO_RETURN_IF_ERROR(store_->FaultPoint("PutValidation"));
  store_->mutex_.AssertHeld();
  return store_->PutValidationLocked(job_id, batch_size, budget_text, round,
                                     validation);
}

absl::StatusOr<std::vector<v1::Task>> Store::Writer::ListTasks(
    absl::string_view job_id) {
  store_->mutex_.AssertHeld();
  return store_->ListTasksLocked(job_id);
}

absl::StatusOr<v1::Task> Store::Writer::GetTask(absl::string_view task_id) {
  store_->mutex_.AssertHeld();
  return store_->GetTaskLocked(task_id);
}

// ---------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------

absl::StatusOr<std::string> Store::ModelPath(absl::string_view sha256) const {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  return absl::StrCat(options_.data_dir, "/", kModelsDir, "/", sha256, ".pt");
}

absl::StatusOr<std::optional<ModelInfo>> Store::FindModel(
    absl::string_view sha256) {
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare("SELECT name, size_bytes, created_unix_ms FROM models "
                   "WHERE sha256 = ?1"));
  stmt->BindText(1, sha256);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return std::nullopt;
  }
  ModelInfo info;
  info.sha256 = std::string(sha256);
  info.name = stmt->ColumnText(0);
  info.size_bytes = stmt->ColumnInt(1);
  info.created_unix_ms = stmt->ColumnInt(2);
  stmt->Reset();
  MUTWO_ASSIGN_OR_RETURN(info.path, ModelPath(sha256));
  return info;
}

absl::StatusOr<std::unique_ptr<TempFile>> Store::NewModelFile() {
  return TempFile::Create(absl::StrCat(options_.data_dir, "/", kModelsDir),
                          "upload");
}

absl::StatusOr<PutModelResult> Store::PutModel(absl::string_view sha256,
                                               absl::string_view name,
                                               int64_t size_bytes,
                                               absl::string_view bytes) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  if (size_bytes != static_cast<int64_t>(bytes.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", sha256, ": declared size ", size_bytes,
        " bytes but received ", bytes.size(), " bytes; nothing stored"));
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<PutModelResult> stored,
                         StoredModel(sha256));
  if (stored.has_value()) return *std::move(stored);
  // The file write (fsyncs included) runs without the lock, so other calls
  // are not held up by a large upload; rename makes it atomic.
  MUTWO_ASSIGN_OR_RETURN(std::unique_ptr<TempFile> file, NewModelFile());
  MUTWO_RETURN_IF_ERROR(file->Append(bytes));
  return PutModelFile(sha256, name, size_bytes, *file);
}

absl::StatusOr<std::optional<PutModelResult>> Store::StoredModel(
    absl::string_view sha256) {
  MUTWO_ASSIGN_OR_RETURN(const std::string path, ModelPath(sha256));
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> existing, FindModel(sha256));
  if (existing.has_value()) {
    absl::StatusOr<int64_t> on_disk = FileSize(path);
    if (on_disk.ok() && *on_disk == existing->size_bytes) {
      return PutModelResult{*std::move(existing), true};
    }
    // The row outlived its file (deleted by hand): write the file again.
  }
  return std::nullopt;
}

absl::StatusOr<PutModelResult> Store::PutModelFile(absl::string_view sha256,
                                                   absl::string_view name,
                                                   int64_t size_bytes,
                                                   TempFile& file) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  if (size_bytes != file.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", sha256, ": declared size ", size_bytes,
        " bytes but received ", file.size(), " bytes; nothing stored"));
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<PutModelResult> stored,
                         StoredModel(sha256));
  if (stored.has_value()) return *std::move(stored);  // `file` is dropped
  MUTWO_RETURN_IF_ERROR(file.Commit(absl::StrCat(sha256, ".pt")));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO models (sha256, name, size_bytes, "
                   "created_unix_ms) VALUES (?1, ?2, ?3, ?4) "
                   "ON CONFLICT (sha256) DO NOTHING"));
  insert->BindText(1, sha256);
  insert->BindText(2, name);
  insert->BindInt(3, size_bytes);
  insert->BindInt(4, NowMs());
  MUTWO_RETURN_IF_ERROR(insert->Run());
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> info, FindModel(sha256));
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  if (!info.has_value()) {
    return absl::InternalError(
        absl::StrCat("model ", sha256, ": row missing after insert"));
  }
  // The bytes were written by this call (a new model, or a row whose file
  // had gone missing), so they were not "already stored".
  return PutModelResult{*std::move(info), false};
}

absl::StatusOr<bool> Store::HasModel(absl::string_view sha256) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> info, FindModel(sha256));
  if (!info.has_value()) {
    return false;
  }
  absl::StatusOr<int64_t> on_disk = FileSize(info->path);
  return on_disk.ok() && *on_disk == info->size_bytes;
}

absl::StatusOr<ModelInfo> Store::GetModelInfo(absl::string_view sha256) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(sha256));
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> info, FindModel(sha256));
  if (!info.has_value()) {
    return absl::NotFoundError(absl::StrCat("model ", sha256, " not stored"));
  }
  return *std::move(info);
}

absl::StatusOr<int64_t> Store::TotalModelBytes() {
  absl::MutexLock lock(&mutex_);
  return db_->QueryInt("SELECT COALESCE(SUM(size_bytes), 0) FROM models");
}

// ---------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------

absl::StatusOr<std::optional<v1::Job>> Store::FindJob(
    absl::string_view job_id) {
  MUTWO_ASSIGN_OR_RETURN(Stmt * stmt,
                         db_->Prepare("SELECT job_id, job FROM jobs "
                                      "WHERE job_id = ?1"));
  stmt->BindText(1, job_id);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return std::nullopt;
  }
  absl::StatusOr<v1::Job> job = JobFromRow(*stmt);
  stmt->Reset();
  if (!job.ok()) {
    return job.status();
  }
  return *std::move(job);
}

absl::StatusOr<v1::Job> Store::RequireJob(absl::string_view job_id) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Job> job, FindJob(job_id));
  if (!job.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("job ", Quote(job_id), " not found"));
  }
  return *std::move(job);
}

absl::StatusOr<CreateJobResult> Store::CreateJob(
    const v1::JobSpec& spec, absl::string_view client_request_id,
    absl::string_view owner) {
  return InTransaction<CreateJobResult>([&] {
    return CreateJobLocked(spec, client_request_id, owner,
                           /*max_unfinished_jobs=*/0);
  });
}

absl::StatusOr<int64_t> Store::CountUnfinishedJobs() {
  absl::MutexLock lock(&mutex_);
  return CountUnfinishedJobsLocked();
}

absl::StatusOr<int64_t> Store::CountUnfinishedJobsLocked() {
  return db_->QueryInt(absl::StrFormat(
      "SELECT COUNT(*) FROM jobs WHERE state NOT IN (%d, %d, %d)",
      v1::Job::SUCCEEDED, v1::Job::FAILED, v1::Job::CANCELLED));
}

absl::StatusOr<CreateJobResult> Store::CreateJobLocked(
    const v1::JobSpec& spec, absl::string_view client_request_id,
    absl::string_view owner, int64_t max_unfinished_jobs) {
  MUTWO_RETURN_IF_ERROR(ValidateSha256(spec.model_sha256()));
  if (!client_request_id.empty()) {
    MUTWO_ASSIGN_OR_RETURN(Stmt * find,
                           db_->Prepare("SELECT job_id, job FROM jobs "
                                        "WHERE client_request_id = ?1 "
                                        "AND owner = ?2"));
    find->BindText(1, client_request_id);
    find->BindText(2, owner);
    MUTWO_ASSIGN_OR_RETURN(bool row, find->Step());
    if (row) {
      absl::StatusOr<v1::Job> first = JobFromRow(*find);
      find->Reset();
      if (!first.ok()) {
        return first.status();
      }
      if (first->spec().SerializeAsString() != spec.SerializeAsString()) {
        return absl::AlreadyExistsError(
            absl::StrCat("client request id ", Quote(client_request_id),
                         " was already used for job ", first->job_id(),
                         " with a different spec; use a new request id"));
      }
      return CreateJobResult{*std::move(first), true};
    }
  }
  MUTWO_ASSIGN_OR_RETURN(std::optional<ModelInfo> model,
                         FindModel(spec.model_sha256()));
  if (!model.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", spec.model_sha256(),
                     " is not stored; upload it before submitting a job"));
  }
  if (max_unfinished_jobs > 0) {
    MUTWO_ASSIGN_OR_RETURN(const int64_t unfinished,
                           CountUnfinishedJobsLocked());
    if (unfinished >= max_unfinished_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat(unfinished,
                       " jobs are unfinished, the limit "
                       "(--max_concurrent_jobs) is ",
                       max_unfinished_jobs, "; retry later"));
    }
  }
  const int64_t now_ms = NowMs();
  v1::Job job;
  job.set_job_id(NewId("job", now_ms));
  *job.mutable_spec() = spec;
  job.set_state(v1::Job::QUEUED);
  job.set_created_unix_ms(now_ms);
  job.set_updated_unix_ms(now_ms);
  job.set_client_request_id(std::string(client_request_id));
  job.set_owner(std::string(owner));
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO jobs (job_id, state, model_sha256, "
                   "client_request_id, created_unix_ms, updated_unix_ms, job, "
                   "owner) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7)"));
  insert->BindText(1, job.job_id());
  insert->BindInt(2, job.state());
  insert->BindText(3, spec.model_sha256());
  insert->BindText(4, client_request_id);
  insert->BindInt(5, now_ms);
  insert->BindBlob(6, job.SerializeAsString());
  insert->BindText(7, owner);
  MUTWO_RETURN_IF_ERROR(insert->Run());
  return CreateJobResult{std::move(job), false};
}

absl::StatusOr<std::optional<Store::BlobRow>> Store::QueryBlob(
    const std::string& sql, const std::function<void(Stmt&)>& bind) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(Stmt * stmt, db_->Prepare(sql));
  bind(*stmt);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return std::nullopt;
  }
  BlobRow out;
  out.blob = stmt->ColumnBlob(0);
  out.flag = stmt->ColumnCount() > 1 && stmt->ColumnInt(1) != 0;
  stmt->Reset();
  return out;
}

absl::StatusOr<v1::Job> Store::GetJob(absl::string_view job_id) {
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<BlobRow> row,
      QueryBlob("SELECT job FROM jobs WHERE job_id = ?1",
                [&](Stmt& stmt) { stmt.BindText(1, job_id); }));
  if (!row.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("job ", Quote(job_id), " not found"));
  }
  MUTWO_ASSIGN_OR_RETURN(
      v1::Job job, ParseRow<v1::Job>(row->blob, absl::StrCat("job ", job_id)));
  if (job.job_id() != job_id) {
    return absl::DataLossError(absl::StrCat(
        "job ", job_id, ": stored proto names job ", Quote(job.job_id())));
  }
  return job;
}

absl::StatusOr<JobPage> Store::ListJobs(const ListJobsQuery& query) {
  if (query.page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page size must be >= 0 (0 = ", kDefaultPageSize,
                     "), got ", query.page_size));
  }
  const int page_size = query.page_size == 0
                            ? kDefaultPageSize
                            : std::min(query.page_size, kMaxPageSize);
  int64_t before_seq = INT64_MAX;
  if (!query.page_token.empty()) {
    MUTWO_ASSIGN_OR_RETURN(before_seq, DecodePageToken(query.page_token));
  }
  std::string sql = "SELECT job_id, job, seq FROM jobs WHERE seq < ?1";
  if (!query.model_sha256.empty()) {
    absl::StrAppend(&sql, " AND model_sha256 = ?2");
  }
  if (query.owner.has_value()) {
    absl::StrAppend(&sql, " AND owner = ?4");
  }
  if (!query.states.empty()) {
    std::vector<std::string> states;
    for (v1::Job::State state : query.states) {
      if (!v1::Job::State_IsValid(state)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown job state ", static_cast<int>(state)));
      }
      states.push_back(absl::StrCat(static_cast<int>(state)));
    }
    // The values are validated enum integers, safe to inline.
    absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(states, ","), ")");
  }
  absl::StrAppend(&sql, " ORDER BY seq DESC LIMIT ?3");

  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(Stmt * stmt, db_->Prepare(sql));
  stmt->BindInt(1, before_seq);
  if (!query.model_sha256.empty()) {
    stmt->BindText(2, query.model_sha256);
  }
  stmt->BindInt(3, page_size + 1);  // one more tells whether a page follows
  if (query.owner.has_value()) {
    stmt->BindText(4, *query.owner);
  }
  JobPage page;
  int64_t last_seq = 0;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = EncodePageToken(last_seq);
      break;
    }
    absl::StatusOr<v1::Job> job = JobFromRow(*stmt);
    if (!job.ok()) {
      stmt->Reset();
      return job.status();
    }
    page.jobs.push_back(*std::move(job));
    last_seq = stmt->ColumnInt(2);
  }
  stmt->Reset();
  return page;
}

absl::StatusOr<v1::Job> Store::UpdateJob(
    absl::string_view job_id,
    const std::function<absl::Status(v1::Job&)>& mutate) {
  return InTransaction<v1::Job>(
      [&] { return UpdateJobLocked(job_id, mutate); });
}

absl::StatusOr<v1::Job> Store::UpdateJobLocked(
    absl::string_view job_id,
    const std::function<absl::Status(v1::Job&)>& mutate) {
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, RequireJob(job_id));
  const v1::Job before = job;
  MUTWO_RETURN_IF_ERROR(mutate(job));
  if (!v1::Job::State_IsValid(job.state())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": invalid state ", job.state()));
  }
  job.set_job_id(before.job_id());
  job.set_created_unix_ms(before.created_unix_ms());
  job.set_client_request_id(before.client_request_id());
  job.set_owner(before.owner());
  job.set_updated_unix_ms(NowMs());
  // WatchJob's change marker: strictly increasing per job, unlike the clock.
  job.set_version(before.version() + 1);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update,
      db_->Prepare("UPDATE jobs SET state = ?2, updated_unix_ms = ?3, "
                   "job = ?4 WHERE job_id = ?1"));
  update->BindText(1, job.job_id());
  update->BindInt(2, job.state());
  update->BindInt(3, job.updated_unix_ms());
  update->BindBlob(4, job.SerializeAsString());
  MUTWO_RETURN_IF_ERROR(update->Run());
  return job;
}

absl::StatusOr<std::map<v1::Job::State, int64_t>> Store::CountJobsByState() {
  MUTWO_ASSIGN_OR_RETURN(auto rows, CountStates("jobs"));
  return StateCounts<v1::Job::State>(rows, "jobs", v1::Job::State_IsValid,
                                     v1::Job::State_MIN, v1::Job::State_MAX);
}

// ---------------------------------------------------------------------------
// Tasks
// ---------------------------------------------------------------------------

absl::StatusOr<std::optional<v1::Task>> Store::FindTask(
    absl::string_view task_id) {
  MUTWO_ASSIGN_OR_RETURN(Stmt * stmt, db_->Prepare(absl::StrCat(
                                          "SELECT ", kTaskColumns,
                                          " FROM tasks WHERE task_id = ?1")));
  stmt->BindText(1, task_id);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return std::nullopt;
  }
  absl::StatusOr<v1::Task> task = TaskFromRow(*stmt);
  stmt->Reset();
  if (!task.ok()) {
    return task.status();
  }
  return *std::move(task);
}

absl::StatusOr<v1::Task> Store::RequireLease(absl::string_view task_id,
                                             int64_t fence_token,
                                             absl::string_view worker_id,
                                             absl::string_view action) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> task, FindTask(task_id));
  if (!task.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("task ", Quote(task_id), " not found"));
  }
  if (task->fence_token() != fence_token) {
    return absl::FailedPreconditionError(
        absl::StrCat(action, " task ", task_id, ": stale fence token ",
                     fence_token, " (current ", task->fence_token(), ", state ",
                     v1::Task::State_Name(task->state()),
                     "); the lease was lost, drop this attempt"));
  }
  if (task->state() != v1::Task::LEASED) {
    return absl::FailedPreconditionError(
        absl::StrCat(action, " task ", task_id, ": the task is ",
                     v1::Task::State_Name(task->state()), ", not LEASED"));
  }
  if (task->lease_owner() != worker_id) {
    return absl::PermissionDeniedError(
        absl::StrCat(action, " task ", task_id, ": worker ", Quote(worker_id),
                     " does not hold its lease"));
  }
  return *std::move(task);
}

absl::Status Store::WriteTaskState(const v1::Task& task, int64_t now_ms) {
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update, db_->Prepare("UPDATE tasks SET state = ?2, attempt = ?3, "
                                  "fence_token = ?4, lease_owner = ?5, "
                                  "lease_expiry_unix_ms = ?6, last_error = ?7, "
                                  "updated_unix_ms = ?8 WHERE task_id = ?1"));
  update->BindText(1, task.task_id());
  update->BindInt(2, task.state());
  update->BindInt(3, task.attempt());
  update->BindInt(4, task.fence_token());
  update->BindText(5, task.lease_owner());
  update->BindInt(6, task.lease_expiry_unix_ms());
  update->BindText(7, task.last_error());
  update->BindInt(8, now_ms);
  return update->Run();
}

absl::StatusOr<v1::Task> Store::AddTask(
    absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
    const std::optional<v1::Schedule>& schedule) {
  // (AddTaskLocked checks the kind, batch size and schedule.)
  return InTransaction<v1::Task>(
      [&] { return AddTaskLocked(job_id, kind, batch_size, schedule); });
}

absl::StatusOr<v1::Task> Store::AddTaskLocked(
    absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
    const std::optional<v1::Schedule>& schedule) {
  if (kind != v1::Task::PROFILE && kind != v1::Task::VALIDATE &&
      kind != v1::Task::MAX_BATCH) {
    return absl::InvalidArgumentError(
        absl::StrCat("task kind must be PROFILE, VALIDATE or MAX_BATCH, got ",
                     static_cast<int>(kind)));
  }
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(batch_size));
  if (kind != v1::Task::PROFILE && !schedule.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(v1::Task::Kind_Name(kind), " task for job ", job_id,
                     " needs the schedule to execute"));
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, RequireJob(job_id));
  if (IsFinished(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::Job::State_Name(job.state()),
                     "; no new tasks"));
  }
  const int64_t now_ms = NowMs();
  v1::Task task;
  task.set_task_id(NewId("task", now_ms));
  task.set_job_id(std::string(job_id));
  task.set_kind(kind);
  task.set_state(v1::Task::QUEUED);
  task.set_batch_size(batch_size);
  task.set_attempt(1);
  if (schedule.has_value()) {
    *task.mutable_schedule() = *schedule;
  }
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO tasks (task_id, job_id, kind, state, "
                   "batch_size, device_kind, attempt, schedule, "
                   "created_unix_ms, updated_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)"));
  insert->BindText(1, task.task_id());
  insert->BindText(2, task.job_id());
  insert->BindInt(3, task.kind());
  insert->BindInt(4, task.state());
  insert->BindInt(5, batch_size);
  insert->BindText(6, absl::AsciiStrToLower(job.spec().device_kind()));
  insert->BindInt(7, task.attempt());
  if (schedule.has_value()) {
    insert->BindBlob(8, schedule->SerializeAsString());
  } else {
    insert->BindNull(8);
  }
  insert->BindInt(9, now_ms);
  MUTWO_RETURN_IF_ERROR(insert->Run());
  return task;
}

absl::StatusOr<std::optional<v1::Task>> Store::LeaseTask(
    absl::string_view worker_id, absl::string_view device_kind,
    int64_t lease_ms) {
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(worker_id, "worker id"));
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(device_kind, "device kind"));
  MUTWO_RETURN_IF_ERROR(ValidateLeaseMs(lease_ms));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * pick,
      db_->Prepare(absl::StrFormat(
          "SELECT t.task_id FROM tasks t JOIN jobs j ON j.job_id = t.job_id "
          "WHERE t.state = %d AND j.state NOT IN (%d, %d, %d) "
          "AND (t.device_kind = '' OR t.device_kind = ?1) "
          "ORDER BY t.seq LIMIT 1",
          v1::Task::QUEUED, v1::Job::SUCCEEDED, v1::Job::FAILED,
          v1::Job::CANCELLED)));
  pick->BindText(1, absl::AsciiStrToLower(device_kind));
  MUTWO_ASSIGN_OR_RETURN(bool row, pick->Step());
  if (!row) {
    return std::nullopt;
  }
  const std::string task_id = pick->ColumnText(0);
  pick->Reset();

  MUTWO_ASSIGN_OR_RETURN(
      Stmt * fence, db_->Prepare("UPDATE meta SET value = value + 1 "
                                 "WHERE key = 'fence_token' RETURNING value"));
  MUTWO_ASSIGN_OR_RETURN(bool fence_row, fence->Step());
  if (!fence_row) {
    return absl::DataLossError("meta table lost its fence_token row");
  }
  const int64_t fence_token = fence->ColumnInt(0);
  MUTWO_RETURN_IF_ERROR(fence->Run());

  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> task, FindTask(task_id));
  if (!task.has_value()) {
    return absl::InternalError(
        absl::StrCat("task ", task_id, " vanished inside its transaction"));
  }
  const int64_t now_ms = NowMs();
  task->set_state(v1::Task::LEASED);
  task->set_fence_token(fence_token);
  task->set_lease_owner(std::string(worker_id));
  task->set_lease_expiry_unix_ms(now_ms + lease_ms);
  MUTWO_RETURN_IF_ERROR(WriteTaskState(*task, now_ms));
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return task;
}

absl::Status Store::ReleaseLease(absl::string_view task_id, int64_t fence_token,
                                 absl::string_view worker_id) {
  return InTransaction([&]() -> absl::Status {
    MUTWO_ASSIGN_OR_RETURN(v1::Task task, RequireLease(task_id, fence_token,
                                                       worker_id, "release"));
    task.set_state(v1::Task::QUEUED);
    task.set_lease_owner("");
    task.set_lease_expiry_unix_ms(0);
    return WriteTaskState(task, NowMs());
  });
}

absl::StatusOr<v1::Task> Store::ExtendLease(absl::string_view task_id,
                                            int64_t fence_token,
                                            absl::string_view worker_id,
                                            int64_t lease_ms) {
  MUTWO_RETURN_IF_ERROR(ValidateLeaseMs(lease_ms));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  MUTWO_ASSIGN_OR_RETURN(
      v1::Task task,
      RequireLease(task_id, fence_token, worker_id, "heartbeat for"));
  const int64_t now_ms = NowMs();
  task.set_lease_expiry_unix_ms(now_ms + lease_ms);
  MUTWO_RETURN_IF_ERROR(WriteTaskState(task, now_ms));
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return task;
}

absl::StatusOr<bool> Store::CompleteTask(absl::string_view task_id,
                                         int64_t fence_token,
                                         absl::string_view worker_id,
                                         absl::string_view result) {
  return InTransaction<bool>([&] {
    return CompleteTaskLocked(task_id, fence_token, worker_id, result);
  });
}

absl::StatusOr<bool> Store::CompleteTaskLocked(absl::string_view task_id,
                                               int64_t fence_token,
                                               absl::string_view worker_id,
                                               absl::string_view result) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> current, FindTask(task_id));
  const bool same_attempt = current.has_value() &&
                            current->fence_token() == fence_token &&
                            current->lease_owner() == worker_id;
  if (same_attempt && current->state() == v1::Task::DONE) {
    return false;  // the same attempt reporting again
  }
  v1::Task task;
  if (same_attempt && current->state() == v1::Task::QUEUED &&
      !worker_id.empty()) {
    // The lease expired and the task was re-queued, but nobody leased it
    // since (a new lease draws a new fence): the result is still the latest
    // work on it, so take it rather than run the task again.
    task = *std::move(current);
  } else {
    MUTWO_ASSIGN_OR_RETURN(
        task, RequireLease(task_id, fence_token, worker_id, "complete"));
  }
  const int64_t now_ms = NowMs();
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * insert,
      db_->Prepare("INSERT INTO task_results (task_id, fence_token, result, "
                   "stored_unix_ms) VALUES (?1, ?2, ?3, ?4)"));
  insert->BindText(1, task_id);
  insert->BindInt(2, fence_token);
  insert->BindBlob(3, result);
  insert->BindInt(4, now_ms);
  MUTWO_RETURN_IF_ERROR(insert->Run());
  task.set_state(v1::Task::DONE);
  task.set_lease_expiry_unix_ms(0);
  MUTWO_RETURN_IF_ERROR(WriteTaskState(task, now_ms));
  return true;
}

absl::StatusOr<v1::Task> Store::FailTask(absl::string_view task_id,
                                         int64_t fence_token,
                                         absl::string_view worker_id,
                                         absl::string_view reason,
                                         bool retryable, int max_attempts) {
  return InTransaction<v1::Task>([&] {
    return FailTaskLocked(task_id, fence_token, worker_id, reason, retryable,
                          max_attempts);
  });
}

absl::StatusOr<v1::Task> Store::FailTaskLocked(
    absl::string_view task_id, int64_t fence_token, absl::string_view worker_id,
    absl::string_view reason, bool retryable, int max_attempts) {
  MUTWO_RETURN_IF_ERROR(ValidateMaxAttempts(max_attempts));
  MUTWO_ASSIGN_OR_RETURN(v1::Task task,
                         RequireLease(task_id, fence_token, worker_id, "fail"));
  task.set_last_error(std::string(reason));
  task.set_lease_owner("");
  task.set_lease_expiry_unix_ms(0);
  if (retryable && task.attempt() < max_attempts) {
    task.set_state(v1::Task::QUEUED);
    task.set_attempt(task.attempt() + 1);
  } else {
    task.set_state(v1::Task::FAILED);
  }
  MUTWO_RETURN_IF_ERROR(WriteTaskState(task, NowMs()));
  return task;
}

absl::StatusOr<std::vector<v1::Task>> Store::RequeueExpiredLeases(
    int max_attempts) {
  MUTWO_RETURN_IF_ERROR(ValidateMaxAttempts(max_attempts));
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  const int64_t now_ms = NowMs();
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare(absl::StrFormat("SELECT %s FROM tasks WHERE state = %d "
                                   "AND lease_expiry_unix_ms <= ?1 "
                                   "ORDER BY seq",
                                   kTaskColumns, v1::Task::LEASED)));
  stmt->BindInt(1, now_ms);
  std::vector<v1::Task> expired;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    absl::StatusOr<v1::Task> task = TaskFromRow(*stmt);
    if (!task.ok()) {
      stmt->Reset();
      return task.status();
    }
    expired.push_back(*std::move(task));
  }
  for (v1::Task& task : expired) {
    const std::string owner = task.lease_owner();
    if (task.attempt() < max_attempts) {
      task.set_state(v1::Task::QUEUED);
      task.set_last_error(absl::StrCat("lease expired (worker ", owner, ")"));
      task.set_attempt(task.attempt() + 1);
    } else {
      task.set_state(v1::Task::FAILED);
      task.set_last_error(absl::StrCat("lease expired (worker ", owner,
                                       ") on attempt ", task.attempt(), " of ",
                                       max_attempts));
    }
    // The owner and the fence stay until the next lease: a result the
    // owner reports before that is still taken (CompleteTask).
    task.set_lease_expiry_unix_ms(0);
    MUTWO_RETURN_IF_ERROR(WriteTaskState(task, now_ms));
  }
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return expired;
}

absl::StatusOr<v1::Task> Store::GetTask(absl::string_view task_id) {
  absl::MutexLock lock(&mutex_);
  return GetTaskLocked(task_id);
}

absl::StatusOr<v1::Task> Store::GetTaskLocked(absl::string_view task_id) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Task> task, FindTask(task_id));
  if (!task.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("task ", Quote(task_id), " not found"));
  }
  return *std::move(task);
}

absl::StatusOr<std::string> Store::GetTaskResult(absl::string_view task_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare("SELECT result FROM task_results WHERE task_id = ?1"));
  stmt->BindText(1, task_id);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("no result stored for task ", Quote(task_id)));
  }
  std::string result = stmt->ColumnBlob(0);
  stmt->Reset();
  return result;
}

absl::StatusOr<std::vector<v1::Task>> Store::ListTasks(
    absl::string_view job_id) {
  absl::MutexLock lock(&mutex_);
  return ListTasksLocked(job_id);
}

absl::StatusOr<std::vector<v1::Task>> Store::ListTasksLocked(
    absl::string_view job_id) {
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare(absl::StrCat("SELECT ", kTaskColumns,
                                " FROM tasks WHERE job_id = ?1 ORDER BY seq")));
  stmt->BindText(1, job_id);
  std::vector<v1::Task> tasks;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    absl::StatusOr<v1::Task> task = TaskFromRow(*stmt);
    if (!task.ok()) {
      stmt->Reset();
      return task.status();
    }
    tasks.push_back(*std::move(task));
  }
  return tasks;
}

absl::StatusOr<std::map<v1::Task::State, int64_t>> Store::CountTasksByState() {
  MUTWO_ASSIGN_OR_RETURN(auto rows, CountStates("tasks"));
  return StateCounts<v1::Task::State>(rows, "tasks", v1::Task::State_IsValid,
                                      v1::Task::State_MIN, v1::Task::State_MAX);
}

absl::StatusOr<std::map<std::string, int64_t>>
Store::CountJobsWithQueuedTasksByDeviceKind() {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare(absl::StrFormat(
          "SELECT t.device_kind, COUNT(DISTINCT t.job_id) FROM tasks t "
          "JOIN jobs j ON j.job_id = t.job_id "
          "WHERE t.state = %d AND j.state NOT IN (%d, %d, %d) "
          "GROUP BY t.device_kind",
          v1::Task::QUEUED, v1::Job::SUCCEEDED, v1::Job::FAILED,
          v1::Job::CANCELLED)));
  std::map<std::string, int64_t> counts;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    counts[stmt->ColumnText(0)] = stmt->ColumnInt(1);
  }
  return counts;
}

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> Store::CountStates(
    absl::string_view table) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt, db_->Prepare(absl::StrCat("SELECT state, COUNT(*) FROM ",
                                             table, " GROUP BY state")));
  std::vector<std::pair<int64_t, int64_t>> rows;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    rows.emplace_back(stmt->ColumnInt(0), stmt->ColumnInt(1));
  }
  return rows;
}

absl::StatusOr<int64_t> Store::CancelJobTasks(absl::string_view job_id) {
  return InTransaction<int64_t>([&] { return CancelJobTasksLocked(job_id); });
}

absl::StatusOr<int64_t> Store::CancelJobTasksLocked(absl::string_view job_id) {
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update,
      db_->Prepare(absl::StrFormat(
          "UPDATE tasks SET state = %d, lease_expiry_unix_ms = 0, "
          "updated_unix_ms = ?2 WHERE job_id = ?1 AND state IN (%d, %d)",
          v1::Task::CANCELLED, v1::Task::QUEUED, v1::Task::LEASED)));
  update->BindText(1, job_id);
  update->BindInt(2, NowMs());
  MUTWO_RETURN_IF_ERROR(update->Run());
  return db_->Changes();
}

// ---------------------------------------------------------------------------
// Profiles, schedules, validations
// ---------------------------------------------------------------------------

absl::Status Store::PutProfile(absl::string_view job_id, int64_t batch_size,
                               const v1::Profile& profile) {
  return InTransaction(
      [&] { return PutProfileLocked(job_id, batch_size, profile); });
}

absl::Status Store::PutProfileLocked(absl::string_view job_id,
                                     int64_t batch_size,
                                     const v1::Profile& profile) {
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(batch_size));
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO profiles (job_id, batch_size, "
                   "graph_fingerprint, profile, updated_unix_ms, device) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (job_id, batch_size) DO UPDATE SET "
                   "graph_fingerprint = excluded.graph_fingerprint, "
                   "profile = excluded.profile, "
                   "updated_unix_ms = excluded.updated_unix_ms, "
                   "device = excluded.device"));
  upsert->BindText(1, job_id);
  upsert->BindInt(2, batch_size);
  upsert->BindText(3, profile.graph_fingerprint());
  upsert->BindBlob(4, profile.SerializeAsString());
  upsert->BindInt(5, NowMs());
  upsert->BindBlob(6, profile.device().SerializeAsString());
  return upsert->Run();
}

absl::StatusOr<v1::Profile> Store::GetProfile(absl::string_view job_id,
                                              int64_t batch_size) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<BlobRow> row,
                         QueryBlob("SELECT profile FROM profiles "
                                   "WHERE job_id = ?1 AND batch_size = ?2",
                                   [&](Stmt& stmt) {
                                     stmt.BindText(1, job_id);
                                     stmt.BindInt(2, batch_size);
                                   }));
  if (!row.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no profile for job ", Quote(job_id), " at batch size ", batch_size));
  }
  return ParseRow<v1::Profile>(
      row->blob,
      absl::StrCat("profile of job ", job_id, " batch ", batch_size));
}

absl::StatusOr<v1::DeviceInfo> Store::GetProfileDevice(absl::string_view job_id,
                                                       int64_t batch_size) {
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<BlobRow> row,
      QueryBlob("SELECT COALESCE(device, profile), device IS NULL "
                "FROM profiles WHERE job_id = ?1 AND batch_size = ?2",
                [&](Stmt& stmt) {
                  stmt.BindText(1, job_id);
                  stmt.BindInt(2, batch_size);
                }));
  if (!row.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no profile for job ", Quote(job_id), " at batch size ", batch_size));
  }
  const std::string what =
      absl::StrCat("profile of job ", job_id, " batch ", batch_size);
  if (row->flag) {  // written by schema version 1: only the whole profile
    MUTWO_ASSIGN_OR_RETURN(v1::Profile profile,
                           ParseRow<v1::Profile>(row->blob, what));
    return profile.device();
  }
  return ParseRow<v1::DeviceInfo>(row->blob, what);
}

absl::StatusOr<std::optional<v1::Schedule>> Store::GetCachedSchedule(
    const ScheduleCacheKey& key) {
  MUTWO_RETURN_IF_ERROR(ValidateScheduleCacheKey(key));
  const std::string cache_key = CanonicalKeyString(key);
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<BlobRow> row,
      QueryBlob("SELECT schedule FROM schedules WHERE cache_key = ?1",
                [&](Stmt& stmt) { stmt.BindText(1, cache_key); }));
  if (!row.has_value()) {
    return std::nullopt;
  }
  MUTWO_ASSIGN_OR_RETURN(
      v1::Schedule schedule,
      ParseRow<v1::Schedule>(row->blob,
                             absl::StrCat("cached schedule ", cache_key)));
  return schedule;
}

absl::Status Store::PutSchedule(const ScheduleCacheKey& key,
                                absl::string_view job_id,
                                const v1::Schedule& schedule) {
  MUTWO_RETURN_IF_ERROR(ValidateScheduleCacheKey(key));
  const std::string cache_key = CanonicalKeyString(key);
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO schedules (cache_key, model_sha256, "
                   "batch_size, job_id, schedule, created_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (cache_key) DO UPDATE SET "
                   "job_id = excluded.job_id, schedule = excluded.schedule, "
                   "created_unix_ms = excluded.created_unix_ms"));
  upsert->BindText(1, cache_key);
  upsert->BindText(2, key.model_sha256);
  upsert->BindInt(3, key.batch_size);
  upsert->BindText(4, job_id);
  upsert->BindBlob(5, schedule.SerializeAsString());
  upsert->BindInt(6, NowMs());
  return upsert->Run();  // one statement: atomic without BEGIN
}

absl::Status Store::PutValidation(absl::string_view job_id, int64_t batch_size,
                                  absl::string_view budget_text, int round,
                                  const v1::Validation& validation) {
  return InTransaction([&] {
    return PutValidationLocked(job_id, batch_size, budget_text, round,
                               validation);
  });
}

absl::Status Store::PutValidationLocked(absl::string_view job_id,
                                        int64_t batch_size,
                                        absl::string_view budget_text,
                                        int round,
                                        const v1::Validation& validation) {
  MUTWO_RETURN_IF_ERROR(ValidateBatchSize(batch_size));
  MUTWO_RETURN_IF_ERROR(RequireNonEmpty(budget_text, "budget text"));
  if (round < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation round ", round, ": must be >= 1"));
  }
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO validations (job_id, batch_size, budget_text, "
                   "round, validation, updated_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (job_id, batch_size, budget_text, round) DO "
                   "UPDATE SET validation = excluded.validation, "
                   "updated_unix_ms = excluded.updated_unix_ms"));
  upsert->BindText(1, job_id);
  upsert->BindInt(2, batch_size);
  upsert->BindText(3, budget_text);
  upsert->BindInt(4, round);
  upsert->BindBlob(5, validation.SerializeAsString());
  upsert->BindInt(6, NowMs());
  return upsert->Run();
}

absl::StatusOr<std::vector<ValidationRecord>> Store::ListValidations(
    absl::string_view job_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_RETURN_IF_ERROR(RequireJob(job_id).status());
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare("SELECT batch_size, budget_text, round, validation "
                   "FROM validations WHERE job_id = ?1 "
                   "ORDER BY batch_size, rowid"));
  stmt->BindText(1, job_id);
  std::vector<ValidationRecord> records;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    ValidationRecord record;
    record.batch_size = stmt->ColumnInt(0);
    record.budget_text = stmt->ColumnText(1);
    record.round = static_cast<int>(stmt->ColumnInt(2));
    absl::StatusOr<v1::Validation> validation = ParseRow<v1::Validation>(
        stmt->ColumnBlob(3),
        absl::StrCat("validation of job ", job_id, " batch ", record.batch_size,
                     " budget ", record.budget_text, " round ", record.round));
    if (!validation.ok()) {
      stmt->Reset();
      return validation.status();
    }
    record.validation = *std::move(validation);
    records.push_back(std::move(record));
  }
  return records;
}

// ---------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------

absl::StatusOr<std::optional<v1::WorkerInfo>> Store::FindWorker(
    absl::string_view worker_id) {
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare(absl::StrCat("SELECT ", kWorkerColumns,
                                " FROM workers WHERE worker_id = ?1")));
  stmt->BindText(1, worker_id);
  MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
  if (!row) {
    return std::nullopt;
  }
  absl::StatusOr<v1::WorkerInfo> worker = WorkerFromRow(*stmt);
  stmt->Reset();
  if (!worker.ok()) {
    return worker.status();
  }
  return *std::move(worker);
}

absl::StatusOr<v1::WorkerInfo> Store::UpsertWorker(
    const v1::WorkerInfo& worker, absl::string_view principal) {
  if (!v1::WorkerInfo::State_IsValid(worker.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker state ", static_cast<int>(worker.state()), " is not valid"));
  }
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  const int64_t now_ms = NowMs();
  v1::WorkerInfo stored = worker;
  if (stored.worker_id().empty()) {
    stored.set_worker_id(NewId("worker", now_ms));
  } else {
    MUTWO_ASSIGN_OR_RETURN(Stmt * owner,
                           db_->Prepare("SELECT principal, state FROM workers "
                                        "WHERE worker_id = ?1"));
    owner->BindText(1, stored.worker_id());
    MUTWO_ASSIGN_OR_RETURN(bool row, owner->Step());
    const bool taken = row && owner->ColumnText(0) != principal &&
                       owner->ColumnInt(1) != v1::WorkerInfo::LOST &&
                       owner->ColumnInt(1) != v1::WorkerInfo::STOPPED;
    owner->Reset();
    if (taken) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker id ", Quote(stored.worker_id()),
          " is registered by another principal and still alive; register "
          "without an id to get a new one"));
    }
  }
  if (stored.state() == v1::WorkerInfo::STATE_UNSPECIFIED ||
      stored.state() == v1::WorkerInfo::LOST ||
      stored.state() == v1::WorkerInfo::STOPPED) {
    stored.set_state(v1::WorkerInfo::IDLE);  // registering means alive
  }
  stored.set_last_heartbeat_unix_ms(now_ms);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * upsert,
      db_->Prepare("INSERT INTO workers (worker_id, state, "
                   "last_heartbeat_unix_ms, current_task_id, info, principal) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT (worker_id) DO UPDATE SET "
                   "state = excluded.state, "
                   "last_heartbeat_unix_ms = excluded.last_heartbeat_unix_ms, "
                   "current_task_id = excluded.current_task_id, "
                   "info = excluded.info, principal = excluded.principal"));
  upsert->BindText(1, stored.worker_id());
  upsert->BindInt(2, stored.state());
  upsert->BindInt(3, now_ms);
  upsert->BindText(4, stored.current_task_id());
  upsert->BindBlob(5, stored.SerializeAsString());
  upsert->BindText(6, principal);
  MUTWO_RETURN_IF_ERROR(upsert->Run());
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::Status Store::TouchWorker(absl::string_view worker_id,
                                v1::WorkerInfo::State state,
                                absl::string_view current_task_id) {
  if (!v1::WorkerInfo::State_IsValid(state) ||
      state == v1::WorkerInfo::STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, ": invalid state ", static_cast<int>(state)));
  }
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update,
      db_->Prepare("UPDATE workers SET state = ?2, last_heartbeat_unix_ms = "
                   "?3, current_task_id = ?4 WHERE worker_id = ?1"));
  update->BindText(1, worker_id);
  update->BindInt(2, state);
  update->BindInt(3, NowMs());
  update->BindText(4, current_task_id);
  MUTWO_RETURN_IF_ERROR(update->Run());
  if (db_->Changes() == 0) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", Quote(worker_id), " is not registered; register first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::WorkerInfo> Store::GetWorker(absl::string_view worker_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::WorkerInfo> worker,
                         FindWorker(worker_id));
  if (!worker.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", Quote(worker_id), " is not registered; register first"));
  }
  return *std::move(worker);
}

absl::StatusOr<int64_t> Store::DeleteForgottenWorkers(int64_t older_than_ms) {
  if (older_than_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("older_than_ms must be positive, got ", older_than_ms));
  }
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(Stmt * del,
                         db_->Prepare(absl::StrFormat(
                             "DELETE FROM workers WHERE state IN (%d, %d) AND "
                             "last_heartbeat_unix_ms < ?1",
                             v1::WorkerInfo::LOST, v1::WorkerInfo::STOPPED)));
  del->BindInt(1, NowMs() - older_than_ms);
  MUTWO_RETURN_IF_ERROR(del->Run());  // one statement: atomic
  return db_->Changes();
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Store::ListWorkers() {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(Stmt * stmt,
                         db_->Prepare(absl::StrCat("SELECT ", kWorkerColumns,
                                                   " FROM workers ORDER BY "
                                                   "worker_id")));
  std::vector<v1::WorkerInfo> workers;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    absl::StatusOr<v1::WorkerInfo> worker = WorkerFromRow(*stmt);
    if (!worker.ok()) {
      stmt->Reset();
      return worker.status();
    }
    workers.push_back(*std::move(worker));
  }
  return workers;
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Store::MarkLostWorkers(
    int64_t older_than_ms) {
  if (older_than_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("older_than_ms must be positive, got ", older_than_ms));
  }
  absl::MutexLock lock(&mutex_);
  Transaction txn(db_.get());
  MUTWO_RETURN_IF_ERROR(txn.Begin());
  const int64_t cutoff_ms = NowMs() - older_than_ms;
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * stmt,
      db_->Prepare(absl::StrFormat(
          "SELECT %s FROM workers WHERE state NOT IN (%d, %d) "
          "AND last_heartbeat_unix_ms < ?1 ORDER BY worker_id",
          kWorkerColumns, v1::WorkerInfo::LOST, v1::WorkerInfo::STOPPED)));
  stmt->BindInt(1, cutoff_ms);
  std::vector<v1::WorkerInfo> lost;
  while (true) {
    MUTWO_ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      break;
    }
    absl::StatusOr<v1::WorkerInfo> worker = WorkerFromRow(*stmt);
    if (!worker.ok()) {
      stmt->Reset();
      return worker.status();
    }
    worker->set_state(v1::WorkerInfo::LOST);
    lost.push_back(*std::move(worker));
  }
  MUTWO_ASSIGN_OR_RETURN(
      Stmt * update, db_->Prepare(absl::StrFormat(
                         "UPDATE workers SET state = %d WHERE worker_id = ?1",
                         v1::WorkerInfo::LOST)));
  for (const v1::WorkerInfo& worker : lost) {
    update->Reset();
    update->BindText(1, worker.worker_id());
    MUTWO_RETURN_IF_ERROR(update->Run());
  }
  MUTWO_RETURN_IF_ERROR(txn.Commit());
  return lost;
}

}  // namespace mutwo::storage
