#include "server/auth/server_security.h"

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "server/auth/token_processor.h"
#include "server/auth/token_table.h"

namespace mutwo::auth {

absl::StatusOr<ServerSecurity> MakeServerSecurity(
    const ServerSecurityOptions& options, const std::string& listen) {
  const bool loopback = IsLoopbackAddress(listen);
  const bool tls = !options.tls_cert_file.empty();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together (the server's certificate chain "
        "and its private key, PEM)");
  }
  if (!options.tls_client_ca_file.empty() && !tls) {
    return absl::InvalidArgumentError(
        "--tls_client_ca (mTLS) needs TLS: give --tls_cert and --tls_key");
  }
  if (options.insecure && !options.tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "--insecure (serve without authentication) contradicts "
        "--auth_tokens_file: drop one of them");
  }
  if (!options.tls_client_ca_file.empty() && options.tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca binds worker certificates to the principals of the "
        "tokens file: give --auth_tokens_file too");
  }
  std::shared_ptr<const TokenTable> tokens;
  if (!options.tokens_file.empty()) {
    auto table = TokenTable::Load(options.tokens_file);
    if (!table.ok()) return table.status();
    tokens = std::make_shared<const TokenTable>(*std::move(table));
  }
  if (tokens == nullptr && !loopback && !options.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve ", listen,
        " without authentication: give --auth_tokens_file (and --tls_cert/"
        "--tls_key), listen on a loopback address, or pass --insecure to let "
        "anyone who reaches the port act as admin"));
  }
  if (tokens != nullptr && !tls && !loopback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bearer tokens would cross the network to ", listen,
        " in clear text: give --tls_cert and --tls_key (or listen on a "
        "loopback address)"));
  }

  ServerSecurity security;
  if (tls) {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca_file.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    auto cert = ReadCredentialFile(options.tls_cert_file, "--tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadCredentialFile(options.tls_key_file, "--tls_key");
    if (!key.ok()) return key.status();
    pair.cert_chain = *std::move(cert);
    pair.private_key = *std::move(key);
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    if (!options.tls_client_ca_file.empty()) {
      auto ca =
          ReadCredentialFile(options.tls_client_ca_file, "--tls_client_ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    security.credentials = grpc::SslServerCredentials(ssl);
    security.description =
        options.tls_client_ca_file.empty() ? "TLS" : "TLS with client certs";
  } else if (tokens != nullptr) {
    // Local credentials: gRPC accepts loopback peers only, and (unlike
    // insecure credentials) they take an AuthMetadataProcessor.
    security.credentials =
        grpc::experimental::LocalServerCredentials(LOCAL_TCP);
    security.description = "no TLS (loopback only)";
  } else {
    security.credentials = grpc::InsecureServerCredentials();
    security.description = "no TLS";
  }
  if (tokens != nullptr) {
    security.tokens = tokens;
    absl::StrAppend(&security.description, ", bearer tokens (", tokens->size(),
                    " principals)");
    security.processor = std::make_shared<TokenAuthProcessor>(
        tokens, !options.tls_client_ca_file.empty());
    security.credentials->SetAuthMetadataProcessor(security.processor);
  } else {
    absl::StrAppend(&security.description,
                    ", no authentication (every caller is admin)");
  }
  return security;
}

}  // namespace mutwo::auth
