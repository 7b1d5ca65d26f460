// The Store's jobs: create (idempotent by client request id), read, list
// by pages, update, count.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "storage/store.h"
#include "storage/store_rows.h"

namespace mutwo::storage {
namespace {

constexpr char kPageTokenPrefix[] = "jobs-before:";

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

}  // namespace

absl::StatusOr<std::optional<v1::Job>> Store::FindJob(
    absl::string_view job_id) {
  return QueryRow<v1::Job>(
      *db_, "SELECT job_id, job FROM jobs WHERE job_id = ?1",
      [&](Stmt& stmt) { stmt.BindText(1, job_id); }, JobFromRow);
}

absl::StatusOr<v1::Job> Store::RequireJob(absl::string_view job_id) {
  MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Job> job, FindJob(job_id));
  if (!job.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("job ", Quote(job_id), " not found"));
  }
  return *std::move(job);
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
    MUTWO_ASSIGN_OR_RETURN(std::optional<v1::Job> first,
                           QueryRow<v1::Job>(
                               *db_,
                               "SELECT job_id, job FROM jobs "
                               "WHERE client_request_id = ?1 AND owner = ?2",
                               [&](Stmt& stmt) {
                                 stmt.BindText(1, client_request_id);
                                 stmt.BindText(2, owner);
                               },
                               JobFromRow));
    if (first.has_value()) {
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
  JobPage page;
  int64_t last_seq = 0;
  MUTWO_RETURN_IF_ERROR(db_->ForEachRow(
      sql,
      [&](Stmt& stmt) {
        stmt.BindInt(1, before_seq);
        if (!query.model_sha256.empty()) {
          stmt.BindText(2, query.model_sha256);
        }
        // One more row than the page tells whether a page follows.
        stmt.BindInt(3, page_size + 1);
        if (query.owner.has_value()) {
          stmt.BindText(4, *query.owner);
        }
      },
      [&](const Stmt& stmt) -> absl::StatusOr<bool> {
        if (static_cast<int>(page.jobs.size()) == page_size) {
          page.next_page_token = EncodePageToken(last_seq);
          return false;
        }
        MUTWO_ASSIGN_OR_RETURN(v1::Job job, JobFromRow(stmt));
        page.jobs.push_back(std::move(job));
        last_seq = stmt.ColumnInt(2);
        return true;
      }));
  return page;
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

absl::StatusOr<std::string> Store::GetJobOwner(absl::string_view job_id) {
  absl::MutexLock lock(&mutex_);
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<std::string> owner,
      QueryRow<std::string>(
          *db_, "SELECT owner FROM jobs WHERE job_id = ?1",
          [&](Stmt& stmt) { stmt.BindText(1, job_id); },
          [](const Stmt& stmt) -> absl::StatusOr<std::string> {
            return stmt.ColumnText(0);
          }));
  if (!owner.has_value()) {
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  }
  return *std::move(owner);
}

}  // namespace mutwo::storage
