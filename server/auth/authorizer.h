// Authorizer: who may call which RPC on what, decided in one place so that
// every handler makes a single call before it touches the core.
//
// Roles (principal.h): a client uploads models, submits jobs for models it
// uploaded itself, and sees, lists, watches, cancels and reads profiles and
// schedules of its own jobs only; it may list workers. An admin does all of
// that for every job and model (and is the only one who sees jobs of owner
// '', stored before owners existed). Only a worker calls WorkerHub; a worker
// id is bound to the principal that registered it, and FetchModel needs a
// lease on a task of a job using the model. The store binds each lease's
// fence token to the worker id that holds it.
//
// Errors: Unauthenticated (no token on the call), PermissionDenied (wrong
// role, another principal's worker id, no lease on the model), NotFound for
// another client's job or model, with the same message as a job or model
// that does not exist, so ids cannot be probed.
//
// When authentication is off (no tokens file) every caller is an admin
// named '' and every check passes.
//
// Thread safety: all methods are thread-safe (the store is).
#ifndef MUTWO_SERVER_AUTH_AUTHORIZER_H_
#define MUTWO_SERVER_AUTH_AUTHORIZER_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "server/auth/principal.h"
#include "server/auth/token_table.h"
#include "storage/store.h"

namespace mutwo::auth {

class Authorizer {
 public:
  // `tokens` null: authentication is off.
  Authorizer(std::shared_ptr<const TokenTable> tokens, storage::Store* store)
      : tokens_(std::move(tokens)), store_(store) {}

  // The caller, checked to have one of `roles` for `rpc` (a method name for
  // the error message).
  [[nodiscard]] absl::StatusOr<Principal> Caller(
      const grpc::ServerContextBase& context, const char* rpc,
      std::initializer_list<Role> roles) const;

  // Planner service.
  [[nodiscard]] absl::StatusOr<Principal> ForUpload(
      const grpc::ServerContextBase& context) const;
  [[nodiscard]] absl::StatusOr<Principal> ForSubmit(
      const grpc::ServerContextBase& context,
      const std::string& model_sha256) const;
  // GetJob, WatchJob, CancelJob, GetProfile, GetSchedule.
  [[nodiscard]] absl::StatusOr<Principal> ForJob(
      const grpc::ServerContextBase& context, const char* rpc,
      const std::string& job_id) const;
  // ListJobs: the owner whose jobs the caller may list; nullopt for all.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> ForListJobs(
      const grpc::ServerContextBase& context) const;
  [[nodiscard]] absl::StatusOr<Principal> ForListWorkers(
      const grpc::ServerContextBase& context) const;

  // WorkerHub service.
  [[nodiscard]] absl::StatusOr<Principal> ForRegister(
      const grpc::ServerContextBase& context) const;
  // LeaseTask, Heartbeat, ReportProfile, ReportValidation, FailTask: the
  // caller is a worker and `worker_id` was registered by it.
  [[nodiscard]] absl::StatusOr<Principal> ForWorker(
      const grpc::ServerContextBase& context, const char* rpc,
      const std::string& worker_id) const;
  [[nodiscard]] absl::StatusOr<Principal> ForFetchModel(
      const grpc::ServerContextBase& context, const std::string& sha256) const;

 private:
  bool authenticate() const { return tokens_ != nullptr; }

  std::shared_ptr<const TokenTable> tokens_;
  storage::Store* store_;
};

}  // namespace mutwo::auth

#endif  // MUTWO_SERVER_AUTH_AUTHORIZER_H_
