// Channel credentials for everything that calls mutwo-server: the `mutwo`
// CLI, `mutwo-worker serve` and the tests. One function decides how a client
// authenticates and whether the wire is encrypted:
//
// - token: `--token_file` (first line of the file), else the file named by
//   MUTWO_TOKEN_FILE, else MUTWO_TOKEN. Sent as `authorization: Bearer
//   TOKEN` on every call. Never printed or logged; errors name the file only.
// - TLS: `--tls_ca` (else MUTWO_TLS_CA) is the PEM CA bundle that verifies
//   the server's certificate; the target's host name must match it.
//   `tls_cert_file`/`tls_key_file` (mutwo-worker --tls_cert/--tls_key)
//   present a client certificate (mTLS, for servers run with
//   --tls_client_ca).
// - A token without TLS is sent only to a loopback server (127.0.0.0/8,
//   ::1, localhost), over gRPC local credentials; to any other address it is
//   refused (FailedPrecondition), so a token never crosses a network in
//   clear text.
// - Neither: an insecure channel, as before authentication existed.
#ifndef MUTWO_COMMON_CREDENTIALS_H_
#define MUTWO_COMMON_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"

namespace mutwo {

struct ClientCredentialsOptions {
  std::string target;  // HOST:PORT of mutwo-server
  std::string token_file;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Read MUTWO_TOKEN_FILE / MUTWO_TOKEN / MUTWO_TLS_CA for what is unset.
  bool use_environment = true;
};

[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientCredentialsOptions& options);

// True for HOST:PORT (or a bare host) naming a loopback address:
// 127.0.0.0/8, ::1 ([::1]:PORT) or localhost, with an optional ipv4:, ipv6:
// or dns:/// prefix. 0.0.0.0 and [::] are not loopback.
bool IsLoopbackAddress(absl::string_view address);

// Reads a whole file (PEM files); NotFound names the flag and the path.
[[nodiscard]] absl::StatusOr<std::string> ReadCredentialFile(
    const std::string& path, absl::string_view what);

}  // namespace mutwo

#endif  // MUTWO_COMMON_CREDENTIALS_H_
