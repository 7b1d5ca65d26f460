#include "client/rpc.h"

#include <chrono>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/args.h"
#include "common/credentials.h"
#include "common/server_address.h"

ABSL_FLAG(std::string, server, "",
          "mutwo-server address (default: $MUTWO_SERVER, else "
          "127.0.0.1:50051)");
ABSL_FLAG(int32_t, timeout_ms, 10000, "deadline of every RPC, in ms");
ABSL_FLAG(std::string, output, "text", "text or json");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is your bearer token (else MUTWO_TOKEN_FILE, "
          "else MUTWO_TOKEN)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the server's certificate: connect with TLS "
          "(else MUTWO_TLS_CA)");

namespace mutwo {

std::string ServerAddress() {
  return ResolveServerAddress(absl::GetFlag(FLAGS_server));
}

std::string ServerFlagsText() {
  std::string out;
  if (!absl::GetFlag(FLAGS_server).empty()) {
    absl::StrAppend(&out, " --server=", absl::GetFlag(FLAGS_server));
  }
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    absl::StrAppend(&out, " --token_file=", absl::GetFlag(FLAGS_token_file));
  }
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) {
    absl::StrAppend(&out, " --tls_ca=", absl::GetFlag(FLAGS_tls_ca));
  }
  return out;
}

std::shared_ptr<grpc::Channel> ServerChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  ClientCredentialsOptions credential_options;
  credential_options.target = ServerAddress();
  credential_options.token_file = absl::GetFlag(FLAGS_token_file);
  credential_options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  auto credentials = MakeChannelCredentials(credential_options);
  if (!credentials.ok()) {
    // Every command that reaches here needs the server; a credential that
    // cannot be used is bad input (the message names the file, never the
    // token).
    std::cerr << "mutwo: " << credentials.status().message() << "\n";
    std::exit(kExitBadInput);
  }
  return grpc::CreateCustomChannel(ServerAddress(), *std::move(credentials),
                                   args);
}

std::unique_ptr<v1::Planner::Stub> PlannerStub() {
  return v1::Planner::NewStub(ServerChannel());
}

void SetDeadline(grpc::ClientContext& context, double factor) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(
                           absl::GetFlag(FLAGS_timeout_ms) * factor)));
}

bool JsonOutput() { return absl::GetFlag(FLAGS_output) == "json"; }

int ExitCodeFor(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnavailable;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ALREADY_EXISTS:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int RpcError(const std::string& command, const grpc::Status& status) {
  std::cerr << "mutwo " << command << ": " << status.error_message() << " ("
            << ServerAddress() << ")\n";
  return ExitCodeFor(status);
}

}  // namespace mutwo
