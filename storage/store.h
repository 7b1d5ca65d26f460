// The service's durable state: uploaded models, jobs, their tasks and leases,
// profiles, the schedule cache, validations and workers, in one SQLite file
// (`<data_dir>/mutwo.db`, WAL, synchronous=FULL, foreign keys on) next to the
// content-addressed model files (`<data_dir>/models/<sha256>.pt`).
//
// Ownership: a Store owns one SQLite connection. Several Stores (in one
// process or in several) may open the same data_dir; SQLite's file locks and
// BEGIN IMMEDIATE keep them consistent (every read-modify-write takes the
// write lock before it reads), and waits on another connection's lock are
// bounded by `busy_timeout_ms`.
//
// Thread safety: every method is thread-safe; calls on one Store are
// serialised by an internal mutex. The UpdateJob mutator runs under that
// mutex and inside the transaction, so it must not call back into the Store.
//
// Errors: InvalidArgument names the bad argument; NotFound names the missing
// id; FailedPrecondition for a stale fence token, a task that is no longer
// leased or a job in the wrong state; AlreadyExists for a client request id
// reused with a different spec; DataLoss when a stored row does not parse
// (a corrupt row is reported, never crashes); Unavailable when another
// connection held the database lock longer than the busy timeout;
// ResourceExhausted when the disk is full.
#ifndef MUTWO_STORAGE_STORE_H_
#define MUTWO_STORAGE_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "mutwo/v1/types.pb.h"
#include "storage/durable_file.h"
#include "storage/schedule_key.h"
#include "storage/sqlite.h"

namespace mutwo::storage {

struct ModelInfo {
  std::string sha256;
  std::string name;
  int64_t size_bytes = 0;
  int64_t created_unix_ms = 0;
  std::string path;  // <data_dir>/models/<sha256>.pt
};

struct PutModelResult {
  ModelInfo info;
  bool already_stored = false;  // the bytes were there; nothing rewritten
};

struct CreateJobResult {
  v1::Job job;
  bool deduplicated = false;  // the client request id was seen before
};

struct ListJobsQuery {
  std::vector<v1::Job::State> states;  // empty: every state
  std::optional<std::string> owner;    // nullopt: every owner
  std::string model_sha256;            // empty: every model
  int page_size = 0;                   // 0: kDefaultPageSize
  std::string page_token;              // from the previous JobPage
};

struct JobPage {
  std::vector<v1::Job> jobs;    // newest first
  std::string next_page_token;  // empty on the last page
};

struct ValidationRecord {
  int64_t batch_size = 0;
  std::string budget_text;
  int round = 1;  // of mutwo-server's closed loop, from 1
  v1::Validation validation;
};

// Who measured a stored profile and what it agreed with: one row per (job,
// batch size), written in the profile report's transaction. The schedule
// cache (server/profile_trust.h) serves a schedule across tenants only from
// a profile these rows show it can trust.
struct ProfileMeasurement {
  std::string job_id;
  int64_t batch_size = 0;
  // MeasurementKeyString (schedule_key.h): model, spec, batch size, device,
  // LibTorch; the same for every job that measures the same thing.
  std::string measurement_key;
  std::string profile_sha256;  // ProfileDigest
  std::string worker_id;
  std::string worker_principal;  // '' when authentication is off
  std::string tenant;            // the job's owner
  int64_t peak_bytes = 0;        // Profile.measured.peak_bytes
  // Why this profile disagrees with another measurement of the same key
  // ('' when it agrees with every one). A key with a flagged row is served
  // no schedule across tenants.
  std::string flag;
  int64_t created_unix_ms = 0;
};

class Store;

// The store's writes (and the reads a write needs), declared once for both
// ways of running them: on the Store each is a transaction of its own; on
// the Store::Writer of a Store::Write it joins that Write's transaction.
// Each behaves the same either way (same checks, same errors).
class StoreWrites {
 public:
  StoreWrites(const StoreWrites&) = delete;
  StoreWrites& operator=(const StoreWrites&) = delete;
  virtual ~StoreWrites() = default;

  // ---- Jobs ----
  // Stores a new QUEUED job for `spec` (whose model must be stored), owned by
  // `owner` (the submitting principal; '' when authentication is off). With
  // a non-empty `client_request_id` this owner used before, returns that
  // first job with deduplicated = true; AlreadyExists if the spec differs
  // from the first. Request ids of different owners never collide. With
  // max_unfinished_jobs > 0, ResourceExhausted when that many jobs are
  // unfinished (checked in the same transaction as the insert, so
  // concurrent submits cannot overshoot the limit); a deduplicated submit
  // is never refused by the limit.
  [[nodiscard]] absl::StatusOr<CreateJobResult> CreateJob(
      const v1::JobSpec& spec, absl::string_view client_request_id,
      absl::string_view owner, int64_t max_unfinished_jobs = 0);
  // Reads the job, lets `mutate` edit it and writes it back; a non-OK status
  // from `mutate` aborts the update and is returned. job_id,
  // created_unix_ms and client_request_id cannot be changed;
  // updated_unix_ms is set to now.
  [[nodiscard]] absl::StatusOr<v1::Job> UpdateJob(
      absl::string_view job_id,
      const std::function<absl::Status(v1::Job&)>& mutate);

  // ---- Tasks ----
  // A QUEUED task, attempt 1, for the job's device kind. NotFound for an
  // unknown job; FailedPrecondition when the job is finished or cancelled.
  [[nodiscard]] absl::StatusOr<v1::Task> AddTask(
      absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
      const std::optional<v1::Schedule>& schedule = std::nullopt);
  // Stores the result and marks the task DONE. Returns true when stored now,
  // false when this fence already completed it (a retried report: nothing
  // stored twice). FailedPrecondition for any other fence or state. A result
  // that arrives after its lease expired is still taken while nobody leased
  // the task since (QUEUED again, same fence and lease owner): the work was
  // done, re-running it would only cost time. PermissionDenied when
  // `worker_id` does not hold the lease.
  [[nodiscard]] absl::StatusOr<bool> CompleteTask(absl::string_view task_id,
                                                  int64_t fence_token,
                                                  absl::string_view worker_id,
                                                  absl::string_view result);
  // A failed attempt: when `retryable` and attempt < max_attempts the task is
  // QUEUED again with attempt + 1, else FAILED (dead letter). last_error =
  // reason either way. Same fence checks as CompleteTask.
  [[nodiscard]] absl::StatusOr<v1::Task> FailTask(absl::string_view task_id,
                                                  int64_t fence_token,
                                                  absl::string_view worker_id,
                                                  absl::string_view reason,
                                                  bool retryable,
                                                  int max_attempts);
  // QUEUED and LEASED tasks of the job become CANCELLED (a worker holding
  // one learns it at its next heartbeat). Returns how many.
  [[nodiscard]] absl::StatusOr<int64_t> CancelJobTasks(
      absl::string_view job_id);
  [[nodiscard]] absl::StatusOr<v1::Task> GetTask(absl::string_view task_id);
  // In creation order. NotFound for an unknown job.
  [[nodiscard]] absl::StatusOr<std::vector<v1::Task>> ListTasks(
      absl::string_view job_id);

  // ---- Profiles and validations ----
  // Replaces any profile stored for (job, batch size).
  [[nodiscard]] absl::Status PutProfile(absl::string_view job_id,
                                        int64_t batch_size,
                                        const v1::Profile& profile);
  // Stores (or replaces) the measurement row of (job, batch size).
  [[nodiscard]] absl::Status PutProfileMeasurement(
      const ProfileMeasurement& measurement);
  // Every measurement of `measurement_key`, oldest first.
  [[nodiscard]] absl::StatusOr<std::vector<ProfileMeasurement>>
  ListProfileMeasurements(absl::string_view measurement_key);
  // Replaces any validation stored for (job, batch size, budget text,
  // round); each round of the closed loop (round >= 1) keeps its own.
  [[nodiscard]] absl::Status PutValidation(absl::string_view job_id,
                                           int64_t batch_size,
                                           absl::string_view budget_text,
                                           int round,
                                           const v1::Validation& validation);

 protected:
  explicit StoreWrites(Store* store) : store_(store) {}
  Store& store() const { return *store_; }

 private:
  // Runs `op` (a body run with the store's mutex held, in an open
  // transaction) as the write step named `step`, or as a read.
  virtual absl::Status RunWrite(absl::string_view step,
                                const std::function<absl::Status()>& op) = 0;
  virtual absl::Status RunRead(const std::function<absl::Status()>& op) = 0;
  template <typename T>
  absl::StatusOr<T> Write(absl::string_view step,
                          const std::function<absl::StatusOr<T>()>& op);
  template <typename T>
  absl::StatusOr<T> Read(const std::function<absl::StatusOr<T>()>& op);

  Store* const store_;
};

class Store : public StoreWrites {
 public:
  static constexpr int kDefaultPageSize = 50;
  static constexpr int kMaxPageSize = 1000;
  // Temp model files older than this at Open are leftovers of a crash.
  static constexpr int64_t kStaleTempFileAgeMs = 60 * 60 * 1000;

  struct Options {
    std::string data_dir;
    int busy_timeout_ms = 5000;
    // Wall clock in Unix milliseconds; injectable so tests can expire leases
    // and workers without sleeping. Defaults to the system clock.
    std::function<int64_t()> now_ms;
    // Fault injection (tests only, leveldb's `log_test` style): called with
    // the name of each step of a Write ("CreateJob", "AddTask", ...,
    // "commit") before it runs; a non-OK status fails that step, so the
    // transaction rolls back. A test may also end the process there (kill
    // -9 between two steps).
    std::function<absl::Status(absl::string_view step)> fault_hook;
  };

  class Writer;

  // Creates data_dir and data_dir/models when missing, opens (or creates)
  // mutwo.db and migrates its schema. FailedPrecondition when the file was
  // written by a newer mutwo.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Store>> Open(
      Options options);
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store() override;

  const std::string& data_dir() const { return options_.data_dir; }
  int64_t NowMs() const { return options_.now_ms(); }

  // Runs `body` in one BEGIN IMMEDIATE transaction: every write it makes
  // through the Writer is committed together when it returns OK, and none is
  // when it returns an error (or the process dies first). `body` runs under
  // the Store's mutex and holds SQLite's write lock: keep it short (plan
  // before, not inside) and never call the Store from it.
  [[nodiscard]] absl::Status Write(
      const std::function<absl::Status(Writer& writer)>& body);

  // ---- Models (content-addressed files) ----
  // Stores `bytes` as models/<sha256>.pt (temp file, fsync, rename, dir
  // fsync), then its row. The caller has verified the sha256; this checks
  // that it is 64 hex digits and that `size_bytes` equals bytes.size()
  // (InvalidArgument otherwise, nothing stored). A second put of the same
  // sha256 returns already_stored and does not rewrite the file.
  [[nodiscard]] absl::StatusOr<PutModelResult> PutModel(
      absl::string_view sha256, absl::string_view name, int64_t size_bytes,
      absl::string_view bytes);
  // A temp file in the model directory for an upload streamed to disk
  // (JobCore's UploadSession), for PutModelFile.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<TempFile>> NewModelFile();
  // PutModel for bytes already written to `file` (NewModelFile): the file
  // becomes models/<sha256>.pt unless the model is stored already (then it
  // is dropped). `size_bytes` must equal the file's size.
  [[nodiscard]] absl::StatusOr<PutModelResult> PutModelFile(
      absl::string_view sha256, absl::string_view name, int64_t size_bytes,
      TempFile& file);
  [[nodiscard]] absl::StatusOr<bool> HasModel(absl::string_view sha256);
  // The file path for a stored model (InvalidArgument for a malformed sha256;
  // the file exists only if HasModel).
  [[nodiscard]] absl::StatusOr<std::string> ModelPath(
      absl::string_view sha256) const;
  [[nodiscard]] absl::StatusOr<ModelInfo> GetModelInfo(
      absl::string_view sha256);
  [[nodiscard]] absl::StatusOr<int64_t> TotalModelBytes();
  // Records that `principal` uploaded the stored model `sha256` (idempotent).
  [[nodiscard]] absl::Status RecordModelUpload(absl::string_view sha256,
                                               absl::string_view principal);
  // Bytes of the stored models `principal` uploaded (each model counted
  // once per uploader, whoever else uploaded the same bytes): its share of
  // the model store, for the per-principal quota.
  [[nodiscard]] absl::StatusOr<int64_t> ModelBytesUploadedBy(
      absl::string_view principal);
  // Whether `principal` ever uploaded `sha256` (RecordModelUpload).
  [[nodiscard]] absl::StatusOr<bool> HasUploadedModel(
      absl::string_view sha256, absl::string_view principal);

  // ---- Jobs ----
  // Jobs not SUCCEEDED, FAILED or CANCELLED.
  [[nodiscard]] absl::StatusOr<int64_t> CountUnfinishedJobs();
  // The principal that submitted the job ('' for jobs stored before owners
  // existed). NotFound for an unknown job, with GetJob's message.
  [[nodiscard]] absl::StatusOr<std::string> GetJobOwner(
      absl::string_view job_id);
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(absl::string_view job_id);
  // Newest first; page tokens stay valid while new jobs are created.
  [[nodiscard]] absl::StatusOr<JobPage> ListJobs(const ListJobsQuery& query);
  // Every state except STATE_UNSPECIFIED, zero when no job is in it.
  [[nodiscard]] absl::StatusOr<std::map<v1::Job::State, int64_t>>
  CountJobsByState();

  // ---- Tasks, leases and fencing ----
  // Leases the oldest QUEUED task whose job wants `device_kind` (or any
  // device) and is not finished or cancelled: state LEASED, a new fence token
  // (greater than every token handed out before), expiry now + lease_ms.
  // nullopt when nothing is queued.
  [[nodiscard]] absl::StatusOr<std::optional<v1::Task>> LeaseTask(
      absl::string_view worker_id, absl::string_view device_kind,
      int64_t lease_ms);
  // The lease calls below name the worker that holds the lease: a fence
  // token is bound to the worker it was handed to, so PermissionDenied when
  // `worker_id` is not the task's lease owner (a guessed or stolen fence).
  //
  // Gives a lease back untouched (the poll that took it was abandoned
  // before the worker saw it): QUEUED again with the same attempt, no lease
  // owner. Same checks as ExtendLease.
  [[nodiscard]] absl::Status ReleaseLease(absl::string_view task_id,
                                          int64_t fence_token,
                                          absl::string_view worker_id);
  // Heartbeat: expiry = now + lease_ms. FailedPrecondition when the fence is
  // stale or the task is no longer LEASED (re-queued, cancelled, done).
  [[nodiscard]] absl::StatusOr<v1::Task> ExtendLease(
      absl::string_view task_id, int64_t fence_token,
      absl::string_view worker_id, int64_t lease_ms);
  // Leases whose expiry is <= now: re-queued with attempt + 1 and last_error
  // "lease expired ...", or FAILED once attempt reached max_attempts. A
  // re-queued task keeps its fence and lease owner until it is leased again
  // (see CompleteTask).
  // Returns the tasks changed, in their new state.
  [[nodiscard]] absl::StatusOr<std::vector<v1::Task>> RequeueExpiredLeases(
      int max_attempts);
  // The result stored by CompleteTask; NotFound when none.
  [[nodiscard]] absl::StatusOr<std::string> GetTaskResult(
      absl::string_view task_id);
  [[nodiscard]] absl::StatusOr<std::map<v1::Task::State, int64_t>>
  CountTasksByState();
  // Unfinished jobs with at least one QUEUED task, by the device kind they
  // ask for ("" for any device). Kinds without such a job are absent.
  [[nodiscard]] absl::StatusOr<std::map<std::string, int64_t>>
  CountJobsWithQueuedTasksByDeviceKind();

  // ---- Profiles ----
  [[nodiscard]] absl::StatusOr<v1::Profile> GetProfile(absl::string_view job_id,
                                                       int64_t batch_size);
  // Only the device the profile was measured on (what the schedule cache key
  // needs), read without parsing the whole profile. NotFound as GetProfile.
  [[nodiscard]] absl::StatusOr<v1::DeviceInfo> GetProfileDevice(
      absl::string_view job_id, int64_t batch_size);

  // The measurement row of (job, batch size); nullopt for a profile stored
  // before schema version 5 (no row) or none.
  [[nodiscard]] absl::StatusOr<std::optional<ProfileMeasurement>>
  GetProfileMeasurement(absl::string_view job_id, int64_t batch_size);

  // ---- Schedule cache ----
  // nullopt on a miss.
  [[nodiscard]] absl::StatusOr<std::optional<v1::Schedule>> GetCachedSchedule(
      const ScheduleCacheKey& key);
  // Stores (or replaces) the schedule for `key`; `job_id` records which job
  // planned it.
  [[nodiscard]] absl::Status PutSchedule(const ScheduleCacheKey& key,
                                         absl::string_view job_id,
                                         const v1::Schedule& schedule);

  // ---- Validations ----
  // By batch size, then in the order they were first stored.
  [[nodiscard]] absl::StatusOr<std::vector<ValidationRecord>> ListValidations(
      absl::string_view job_id);

  // ---- Workers ----
  // Registers or re-registers a worker for `principal` (the registering
  // identity; '' when authentication is off): assigns an id when worker_id
  // is empty, sets last_heartbeat_unix_ms = now and state IDLE when unset.
  // PermissionDenied when the id belongs to another principal's worker that
  // is not LOST (a LOST worker's id may be taken over).
  [[nodiscard]] absl::StatusOr<v1::WorkerInfo> UpsertWorker(
      const v1::WorkerInfo& worker, absl::string_view principal);
  // The principal a worker id is bound to; NotFound when not registered.
  [[nodiscard]] absl::StatusOr<std::string> GetWorkerPrincipal(
      absl::string_view worker_id);
  // Whether a worker registered by `principal` holds a lease (LEASED task)
  // of a job whose model is `sha256`: what FetchModel needs.
  [[nodiscard]] absl::StatusOr<bool> HoldsLeaseOnModel(
      absl::string_view principal, absl::string_view sha256);
  // A heartbeat from a registered worker (NotFound otherwise).
  [[nodiscard]] absl::Status TouchWorker(absl::string_view worker_id,
                                         v1::WorkerInfo::State state,
                                         absl::string_view current_task_id);
  [[nodiscard]] absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // One worker (NotFound when not registered): what leasing needs, without
  // reading every worker.
  [[nodiscard]] absl::StatusOr<v1::WorkerInfo> GetWorker(
      absl::string_view worker_id);
  // Forgets workers LOST or STOPPED whose last heartbeat is older than now -
  // older_than_ms (their ids may be registered again); returns how many.
  [[nodiscard]] absl::StatusOr<int64_t> DeleteForgottenWorkers(
      int64_t older_than_ms);
  // Workers not LOST whose last heartbeat is older than now - older_than_ms
  // become LOST; returns them.
  [[nodiscard]] absl::StatusOr<std::vector<v1::WorkerInfo>> MarkLostWorkers(
      int64_t older_than_ms);

 private:
  friend class StoreWrites;
  Store(Options options, std::unique_ptr<Db> db);

  // Each write in a transaction of its own.
  absl::Status RunWrite(absl::string_view step,
                        const std::function<absl::Status()>& op) override;
  absl::Status RunRead(const std::function<absl::Status()>& op) override;

  // The bodies of StoreWrites' operations, run with the mutex held and
  // inside an open transaction (by the Store or by a Writer).
  absl::StatusOr<CreateJobResult> CreateJobLocked(
      const v1::JobSpec& spec, absl::string_view client_request_id,
      absl::string_view owner, int64_t max_unfinished_jobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<int64_t> CountUnfinishedJobsLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<v1::Job> UpdateJobLocked(
      absl::string_view job_id,
      const std::function<absl::Status(v1::Job&)>& mutate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<v1::Task> AddTaskLocked(
      absl::string_view job_id, v1::Task::Kind kind, int64_t batch_size,
      const std::optional<v1::Schedule>& schedule)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<bool> CompleteTaskLocked(absl::string_view task_id,
                                          int64_t fence_token,
                                          absl::string_view worker_id,
                                          absl::string_view result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<v1::Task> FailTaskLocked(absl::string_view task_id,
                                          int64_t fence_token,
                                          absl::string_view worker_id,
                                          absl::string_view reason,
                                          bool retryable, int max_attempts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<int64_t> CancelJobTasksLocked(absl::string_view job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status PutProfileLocked(absl::string_view job_id, int64_t batch_size,
                                const v1::Profile& profile)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status PutProfileMeasurementLocked(const ProfileMeasurement& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<std::vector<ProfileMeasurement>> ListProfileMeasurementsLocked(
      absl::string_view measurement_key, absl::string_view job_id,
      int64_t batch_size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status PutValidationLocked(absl::string_view job_id, int64_t batch_size,
                                   absl::string_view budget_text, int round,
                                   const v1::Validation& validation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<std::vector<v1::Task>> ListTasksLocked(
      absl::string_view job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<v1::Task> GetTaskLocked(absl::string_view task_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Runs `body` with the mutex held inside BEGIN IMMEDIATE ... COMMIT.
  absl::Status InTransaction(const std::function<absl::Status()>& body)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // options_.fault_hook at a named step of a Write.
  absl::Status FaultPoint(absl::string_view step) const;

  // (state, count) rows of `table` ("jobs" or "tasks").
  absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> CountStates(
      absl::string_view table) ABSL_LOCKS_EXCLUDED(mutex_);
  absl::StatusOr<std::optional<ModelInfo>> FindModel(absl::string_view sha256)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The model's row and file, when both are there (PutModel need not write).
  absl::StatusOr<std::optional<PutModelResult>> StoredModel(
      absl::string_view sha256) ABSL_LOCKS_EXCLUDED(mutex_);
  absl::StatusOr<std::optional<v1::Job>> FindJob(absl::string_view job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<v1::Job> RequireJob(absl::string_view job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<std::optional<v1::Task>> FindTask(absl::string_view task_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The task, checked to be LEASED under `fence_token` by `worker_id`.
  absl::StatusOr<v1::Task> RequireLease(absl::string_view task_id,
                                        int64_t fence_token,
                                        absl::string_view worker_id,
                                        absl::string_view action)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status WriteTaskState(const v1::Task& task, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A single-row read under the lock, returning the row's first column as
  // bytes and its optional second column as a flag (nullopt when no row), so
  // that the hot read paths parse their protos after releasing the lock.
  struct BlobRow {
    std::string blob;
    bool flag = false;
  };
  absl::StatusOr<std::optional<BlobRow>> QueryBlob(
      const std::string& sql, const std::function<void(Stmt&)>& bind)
      ABSL_LOCKS_EXCLUDED(mutex_);
  absl::StatusOr<std::optional<v1::WorkerInfo>> FindWorker(
      absl::string_view worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Options options_;
  mutable absl::Mutex mutex_;
  std::unique_ptr<Db> db_ ABSL_GUARDED_BY(mutex_);
};

// A Store::Write body's handle: the writes of StoreWrites, run inside the
// Write's transaction (each after the fault hook's step of its name), so
// they commit together or not at all. Valid only inside the Write that
// handed it out.
class Store::Writer final : public StoreWrites {
 public:
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

 private:
  friend class Store;
  explicit Writer(Store* store) : StoreWrites(store) {}
  absl::Status RunWrite(absl::string_view step,
                        const std::function<absl::Status()>& op) override;
  absl::Status RunRead(const std::function<absl::Status()>& op) override;
};

}  // namespace mutwo::storage

#endif  // MUTWO_STORAGE_STORE_H_
