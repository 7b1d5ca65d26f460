// Who is calling: the principal a bearer token names (tokens file, see
// token_table.h) and its role. TokenAuthProcessor attaches it to the call's
// grpc::AuthContext as two properties; handlers read it back with
// PrincipalFromAuthContext (through Authorizer, never directly).
#ifndef MUTWO_SERVER_AUTH_PRINCIPAL_H_
#define MUTWO_SERVER_AUTH_PRINCIPAL_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_context.h"

namespace mutwo::auth {

// client: uploads models, submits and reads its own jobs, lists workers.
// worker: the WorkerHub service only. admin: every Planner RPC on every job.
enum class Role { kClient, kWorker, kAdmin };

const char* RoleName(Role role);
// "client", "worker" or "admin"; InvalidArgument names the text otherwise.
absl::StatusOr<Role> ParseRole(absl::string_view text);

struct Principal {
  // From the tokens file; '' only when the server runs without
  // authentication (then every caller is an admin named '').
  std::string name;
  Role role = Role::kClient;
};

// Auth-context property names set by TokenAuthProcessor.
inline constexpr char kPrincipalProperty[] = "mutwo.principal";
inline constexpr char kRoleProperty[] = "mutwo.role";

// The principal attached to the call, nullopt when the call carried no
// token (or the properties do not parse).
std::optional<Principal> PrincipalFromAuthContext(
    const grpc::AuthContext& context);

}  // namespace mutwo::auth

#endif  // MUTWO_SERVER_AUTH_PRINCIPAL_H_
