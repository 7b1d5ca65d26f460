// Who is calling: the principal a bearer token names (tokens file, see
// token_table.h) and its role. Authorizer derives it for every call from
// the call's own `authorization` header, which TokenAuthProcessor has
// already checked. (Not from grpc::AuthContext properties: in gRPC 1.51 the
// AuthContext a processor writes to is shared by every call of a
// connection, so a property added for one call is still there, and
// repeated, for the next call on that connection, token or not.)
#ifndef MUTWO_SERVER_AUTH_PRINCIPAL_H_
#define MUTWO_SERVER_AUTH_PRINCIPAL_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// The metadata key of the token: `authorization: Bearer TOKEN`.
inline constexpr char kAuthorizationHeader[] = "authorization";

// The token of an `authorization` header value; InvalidArgument when it is
// not "Bearer TOKEN" (the scheme is case-insensitive). Never echoes it.
absl::StatusOr<absl::string_view> BearerToken(absl::string_view header);

}  // namespace mutwo::auth

#endif  // MUTWO_SERVER_AUTH_PRINCIPAL_H_
