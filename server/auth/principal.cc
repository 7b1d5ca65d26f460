#include "server/auth/principal.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

absl::StatusOr<absl::string_view> BearerToken(absl::string_view header) {
  constexpr absl::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(header, kScheme)) {
    return absl::InvalidArgumentError(
        "the authorization header must be \"Bearer TOKEN\"");
  }
  const absl::string_view token =
      absl::StripAsciiWhitespace(header.substr(kScheme.size()));
  if (token.empty()) {
    return absl::InvalidArgumentError("the bearer token is empty");
  }
  return token;
}

}  // namespace mutwo::auth
