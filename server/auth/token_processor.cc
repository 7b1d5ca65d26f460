#include "server/auth/token_processor.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace mutwo::auth {
namespace {

// The one service callable without a token (load balancers and probes).
constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";

}  // namespace

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata*, OutputMetadata*) {
  auto refuse = [this](const char* reason, const std::string& why) {
    if (on_refusal_) on_refusal_(reason);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
  };
  const auto range = auth_metadata.equal_range(kAuthorizationHeader);
  if (range.first == range.second) {
    const auto path = auth_metadata.find(":path");
    const absl::string_view method =
        path == auth_metadata.end()
            ? absl::string_view()
            : absl::string_view(path->second.data(), path->second.size());
    if (absl::StartsWith(method, kHealthPrefix)) return grpc::Status::OK;
    return refuse("missing_token",
                  absl::StrCat(method.empty() ? "this RPC" : method,
                               " needs a bearer token: pass --token_file, or "
                               "set MUTWO_TOKEN_FILE or MUTWO_TOKEN"));
  }
  if (std::next(range.first) != range.second) {
    return refuse("malformed", "more than one authorization header");
  }
  auto token = BearerToken(absl::string_view(range.first->second.data(),
                                             range.first->second.size()));
  if (!token.ok()) {
    return refuse("malformed", std::string(token.status().message()));
  }
  std::optional<Principal> principal = tokens_->Find(*token);
  if (!principal.has_value()) {
    return refuse(
        "invalid_token",
        "the bearer token is not valid (not in the server's tokens file)");
  }
  if (require_worker_certificate_ && principal->role == Role::kWorker) {
    // The certificate is the connection's: the AuthContext is right here.
    bool matches = false;
    for (const auto& cn : context->FindPropertyValues("x509_common_name")) {
      if (absl::string_view(cn.data(), cn.size()) == principal->name) {
        matches = true;
      }
    }
    if (!matches) {
      return refuse(
          "no_client_certificate",
          absl::StrCat(
              "worker \"", principal->name,
              "\" must connect with a client certificate (signed by the "
              "server's "
              "--tls_client_ca) whose common name is its principal name"));
    }
  }
  return grpc::Status::OK;
}

}  // namespace mutwo::auth
