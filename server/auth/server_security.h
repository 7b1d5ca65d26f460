// How mutwo-server's gRPC port is secured, decided once at start from the
// flags:
//
//   --auth_tokens_file  bearer tokens (token_table.h); every RPC but
//                       grpc.health.v1 then needs one (TokenAuthProcessor).
//   --tls_cert/--tls_key  TLS on the port (PEM certificate chain and key).
//   --tls_client_ca     mTLS: clients may present a certificate signed by
//                       this CA; a worker principal must (its common name =
//                       the principal name). Needs --tls_cert and tokens.
//   --insecure          allow a server without tokens on a non-loopback
//                       address (anyone who can reach the port is admin);
//                       refused together with a tokens file.
//
// Without a tokens file authentication is off: every caller is an admin
// named '' (jobs get owner ''), which is what a loopback development server,
// the demo and the tests run with. That is allowed on a loopback address
// only, unless --insecure. Tokens without TLS are allowed on a loopback
// address only (gRPC local credentials: the peer must be on this host); a
// non-loopback address with tokens needs TLS, --insecure or not.
#ifndef MUTWO_SERVER_AUTH_SERVER_SECURITY_H_
#define MUTWO_SERVER_AUTH_SERVER_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/auth/token_processor.h"
#include "server/auth/token_table.h"

namespace mutwo::auth {

struct ServerSecurityOptions {
  std::string tokens_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  bool insecure = false;
};

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // The accepted tokens; null: no authentication, every caller is an admin
  // named ''.
  std::shared_ptr<const TokenTable> tokens;
  // Attached to `credentials` when there are tokens (null otherwise).
  std::shared_ptr<TokenAuthProcessor> processor;
  // For the start-up log line, e.g. "TLS, bearer tokens (5 principals)".
  std::string description;
};

// Reads the files and builds the credentials. InvalidArgument for a refused
// combination, naming the flag to add; NotFound for an unreadable file.
[[nodiscard]] absl::StatusOr<ServerSecurity> MakeServerSecurity(
    const ServerSecurityOptions& options, const std::string& listen);

}  // namespace mutwo::auth

#endif  // MUTWO_SERVER_AUTH_SERVER_SECURITY_H_
