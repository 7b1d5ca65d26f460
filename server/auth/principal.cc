#include "server/auth/principal.h"

#include "absl/strings/str_cat.h"

namespace mutwo::auth {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kClient:
      return "client";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view text) {
  if (text == "client") return Role::kClient;
  if (text == "worker") return Role::kWorker;
  if (text == "admin") return Role::kAdmin;
  return absl::InvalidArgumentError(
      absl::StrCat("role \"", text, "\": use client, worker or admin"));
}

std::optional<Principal> PrincipalFromAuthContext(
    const grpc::AuthContext& context) {
  const auto names = context.FindPropertyValues(kPrincipalProperty);
  const auto roles = context.FindPropertyValues(kRoleProperty);
  if (names.size() != 1 || roles.size() != 1) return std::nullopt;
  auto role = ParseRole(absl::string_view(roles[0].data(), roles[0].size()));
  if (!role.ok()) return std::nullopt;
  Principal principal;
  principal.name.assign(names[0].data(), names[0].size());
  principal.role = *role;
  return principal;
}

}  // namespace mutwo::auth
