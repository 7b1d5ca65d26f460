// TokenAuthProcessor: the server side of bearer-token authentication, run by
// gRPC on every call before the handler (attached to the server credentials
// with SetAuthMetadataProcessor).
//
// - No `authorization` metadata: refused with UNAUTHENTICATED, except for
//   grpc.health.v1 (probes need no token). This covers the services gRPC
//   adds (reflection) as well as mutwo's, whose handlers check again.
// - `authorization: Bearer TOKEN` naming a known token: the call goes on;
//   Authorizer maps the same header to the principal for this call (the
//   AuthContext is per connection in gRPC 1.51, see principal.h, so nothing
//   is added to it). Handlers only hand the header to Authorizer; nothing
//   logs metadata.
// - Anything else (unknown token, another scheme, two headers): the call
//   fails with UNAUTHENTICATED. The token is never logged or echoed.
// - With `require_worker_certificate` (mTLS, --tls_client_ca), a worker's
//   token is accepted only over a connection whose verified client
//   certificate has the principal's name as its common name.
//
// Thread safety: Process is called concurrently; the table is immutable.
#ifndef MUTWO_SERVER_AUTH_TOKEN_PROCESSOR_H_
#define MUTWO_SERVER_AUTH_TOKEN_PROCESSOR_H_

#include <functional>
#include <memory>

#include "grpcpp/security/auth_metadata_processor.h"
#include "server/auth/token_table.h"

namespace mutwo::auth {

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  TokenAuthProcessor(std::shared_ptr<const TokenTable> tokens,
                     bool require_worker_certificate)
      : tokens_(std::move(tokens)),
        require_worker_certificate_(require_worker_certificate) {}

  // Called with the reason of every refused call (missing_token,
  // invalid_token, malformed, no_client_certificate), e.g. to count it. Set
  // before the server starts.
  void OnRefusal(std::function<void(const char* reason)> on_refusal) {
    on_refusal_ = std::move(on_refusal);
  }

  // A table lookup in memory: run inline on gRPC's thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<const TokenTable> tokens_;
  bool require_worker_certificate_;
  std::function<void(const char*)> on_refusal_;
};

}  // namespace mutwo::auth

#endif  // MUTWO_SERVER_AUTH_TOKEN_PROCESSOR_H_
