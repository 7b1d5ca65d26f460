#include "server/auth/authorizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mutwo::auth {
namespace {

absl::Status JobNotFound(const std::string& job_id) {
  // The store's message for a missing job: another client's job looks the
  // same.
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

}  // namespace

absl::StatusOr<Principal> Authorizer::Caller(
    const grpc::ServerContextBase& context, const char* rpc,
    std::initializer_list<Role> roles) const {
  if (!authenticate()) return Principal{"", Role::kAdmin};
  // This call's own header (TokenAuthProcessor refused the call if it was
  // malformed or unknown).
  std::optional<Principal> principal;
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find(kAuthorizationHeader);
  if (header != metadata.end()) {
    auto token = BearerToken(
        absl::string_view(header->second.data(), header->second.size()));
    if (token.ok()) principal = tokens_->Find(*token);
  }
  if (!principal.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        rpc,
        " needs a bearer token: pass --token_file, or set MUTWO_TOKEN_FILE or "
        "MUTWO_TOKEN"));
  }
  for (Role role : roles) {
    if (principal->role == role) return *std::move(principal);
  }
  std::vector<std::string> names;
  for (Role role : roles) names.push_back(RoleName(role));
  return absl::PermissionDeniedError(
      absl::StrCat("principal \"", principal->name, "\" (",
                   RoleName(principal->role), ") may not call ", rpc,
                   "; it needs role ", absl::StrJoin(names, " or ")));
}

absl::StatusOr<Principal> Authorizer::ForUpload(
    const grpc::ServerContextBase& context) const {
  return Caller(context, "UploadModel", {Role::kClient, Role::kAdmin});
}

absl::StatusOr<Principal> Authorizer::ForSubmit(
    const grpc::ServerContextBase& context,
    const std::string& model_sha256) const {
  MUTWO_ASSIGN_OR_RETURN(
      Principal caller,
      Caller(context, "SubmitJob", {Role::kClient, Role::kAdmin}));
  if (caller.role == Role::kAdmin) return caller;
  MUTWO_ASSIGN_OR_RETURN(bool uploaded,
                         store_->HasUploadedModel(model_sha256, caller.name));
  if (!uploaded) {
    // The message of a model nobody uploaded: other clients' models stay
    // invisible.
    return absl::NotFoundError(
        absl::StrCat("model ", model_sha256,
                     " is not uploaded; upload it first (mutwo submit does)"));
  }
  return caller;
}

absl::StatusOr<Principal> Authorizer::ForJob(
    const grpc::ServerContextBase& context, const char* rpc,
    const std::string& job_id) const {
  MUTWO_ASSIGN_OR_RETURN(Principal caller,
                         Caller(context, rpc, {Role::kClient, Role::kAdmin}));
  if (caller.role == Role::kAdmin) return caller;
  MUTWO_ASSIGN_OR_RETURN(std::string owner, store_->GetJobOwner(job_id));
  if (owner != caller.name) return JobNotFound(job_id);
  return caller;
}

absl::StatusOr<std::optional<std::string>> Authorizer::ForListJobs(
    const grpc::ServerContextBase& context) const {
  MUTWO_ASSIGN_OR_RETURN(
      Principal caller,
      Caller(context, "ListJobs", {Role::kClient, Role::kAdmin}));
  if (caller.role == Role::kAdmin) return std::optional<std::string>();
  return std::optional<std::string>(caller.name);
}

absl::StatusOr<Principal> Authorizer::ForListWorkers(
    const grpc::ServerContextBase& context) const {
  return Caller(context, "ListWorkers", {Role::kClient, Role::kAdmin});
}

absl::StatusOr<Principal> Authorizer::ForRegister(
    const grpc::ServerContextBase& context) const {
  return Caller(context, "RegisterWorker", {Role::kWorker});
}

absl::StatusOr<Principal> Authorizer::ForWorker(
    const grpc::ServerContextBase& context, const char* rpc,
    const std::string& worker_id) const {
  MUTWO_ASSIGN_OR_RETURN(Principal caller,
                         Caller(context, rpc, {Role::kWorker}));
  if (!authenticate()) return caller;
  MUTWO_ASSIGN_OR_RETURN(std::string bound,
                         store_->GetWorkerPrincipal(worker_id));
  if (bound != caller.name) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker \"", worker_id,
        "\" was registered by another principal than \"", caller.name, "\""));
  }
  return caller;
}

absl::StatusOr<Principal> Authorizer::ForFetchModel(
    const grpc::ServerContextBase& context, const std::string& sha256) const {
  MUTWO_ASSIGN_OR_RETURN(Principal caller,
                         Caller(context, "FetchModel", {Role::kWorker}));
  if (!authenticate()) return caller;
  MUTWO_ASSIGN_OR_RETURN(bool leased,
                         store_->HoldsLeaseOnModel(caller.name, sha256));
  if (!leased) {
    return absl::PermissionDeniedError(absl::StrCat(
        "model ", sha256, ": no worker of \"", caller.name,
        "\" holds a lease on a task that uses it; lease the task first"));
  }
  return caller;
}

}  // namespace mutwo::auth
