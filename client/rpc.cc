#include "client/rpc.h"

#include <chrono>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/args.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "mutwo-server address");
ABSL_FLAG(int32_t, timeout_ms, 10000, "deadline of every RPC, in ms");
ABSL_FLAG(std::string, output, "text", "text or json");

namespace mutwo {

std::shared_ptr<grpc::Channel> ServerChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server),
                                   grpc::InsecureChannelCredentials(), args);
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
            << absl::GetFlag(FLAGS_server) << ")\n";
  return ExitCodeFor(status);
}

}  // namespace mutwo
