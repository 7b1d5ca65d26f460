#include "server/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace mutwo {

absl::StatusOr<std::unique_ptr<MutwoServer>> MutwoServer::Create(
    Options options) {
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("--listen must not be empty");
  }
  return std::unique_ptr<MutwoServer>(new MutwoServer(std::move(options)));
}

absl::Status MutwoServer::Start() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(),
                           &port_);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", options_.listen,
                     "\": address in use or invalid"));
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  MUTWO_LOG(info, "listening on {} (port {})", options_.listen, port_);
  return absl::OkStatus();
}

void MutwoServer::Shutdown(absl::Duration drain_timeout) {
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(drain_timeout));
  server_->Wait();
  server_.reset();
}

MutwoServer::~MutwoServer() { Shutdown(absl::Seconds(1)); }

}  // namespace mutwo
