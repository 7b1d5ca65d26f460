#include "common/credentials.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mutwo {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// The token: the first line of `path`, without surrounding whitespace.
absl::StatusOr<std::string> ReadToken(const std::string& path,
                                      absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, ": token file \"", path, "\" cannot be read"));
  }
  std::string line;
  std::getline(in, line);
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": token file \"", path, "\" has no token on its first line"));
  }
  return token;
}

}  // namespace

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path,
                                               absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, ": \"", path, "\" cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::ConsumePrefix(&address, "dns:///");
  absl::ConsumePrefix(&address, "ipv4:");
  absl::ConsumePrefix(&address, "ipv6:");
  absl::string_view host = address;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t end = host.find(']');
    if (end == absl::string_view::npos) return false;
    host = host.substr(0, end);
  } else if (std::count(address.begin(), address.end(), ':') == 1) {
    host = address.substr(0, address.find(':'));
  }
  if (absl::EqualsIgnoreCase(host, "localhost") || host == "::1") return true;
  const std::vector<absl::string_view> octets = absl::StrSplit(host, '.');
  if (octets.size() != 4 || octets[0] != "127") return false;
  for (absl::string_view octet : octets) {
    int value = 0;
    if (!absl::SimpleAtoi(octet, &value) || value < 0 || value > 255) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientCredentialsOptions& options) {
  std::string token_file = options.token_file;
  std::string tls_ca_file = options.tls_ca_file;
  std::string token;
  if (!token_file.empty()) {
    auto read = ReadToken(token_file, "--token_file");
    if (!read.ok()) return read.status();
    token = *std::move(read);
  } else if (options.use_environment) {
    token_file = Env("MUTWO_TOKEN_FILE");
    if (!token_file.empty()) {
      auto read = ReadToken(token_file, "MUTWO_TOKEN_FILE");
      if (!read.ok()) return read.status();
      token = *std::move(read);
    } else {
      token = std::string(absl::StripAsciiWhitespace(Env("MUTWO_TOKEN")));
    }
  }
  if (tls_ca_file.empty() && options.use_environment) {
    tls_ca_file = Env("MUTWO_TLS_CA");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together (a client certificate and its "
        "key)");
  }
  if (!options.tls_cert_file.empty() && tls_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate (--tls_cert) needs TLS: give --tls_ca too");
  }

  if (!tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadCredentialFile(tls_ca_file, "--tls_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (!options.tls_cert_file.empty()) {
      auto cert = ReadCredentialFile(options.tls_cert_file, "--tls_cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadCredentialFile(options.tls_key_file, "--tls_key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    auto channel = grpc::SslCredentials(ssl);
    if (token.empty()) return channel;
    return grpc::CompositeChannelCredentials(
        channel, grpc::AccessTokenCredentials(token));
  }
  if (token.empty()) return grpc::InsecureChannelCredentials();
  if (!IsLoopbackAddress(options.target)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a token is sent to ", options.target,
        " only over TLS: give --tls_ca (or MUTWO_TLS_CA) with the CA that "
        "signed the server's certificate"));
  }
  // Local credentials: no encryption, but gRPC checks that the peer is on
  // this host and lets call credentials (the token) through.
  return grpc::CompositeChannelCredentials(
      grpc::experimental::LocalCredentials(LOCAL_TCP),
      grpc::AccessTokenCredentials(token));
}

}  // namespace mutwo
