#include "server/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "server/defined_status.h"

namespace mutwo {

namespace {
// Largest message: a model chunk is 1 MiB; profiles of big graphs and
// schedules with timelines can reach tens of MiB.
constexpr int kMaxMessageBytes = 64 << 20;
}  // namespace

absl::StatusOr<std::unique_ptr<MutwoServer>> MutwoServer::Create(
    Options options) {
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("--listen must not be empty");
  }
  if (options.data_dir.empty()) {
    return absl::InvalidArgumentError("--data_dir must not be empty");
  }
  if (options.max_rpc_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_rpc_threads must be 0 (gRPC's default) or more, got ",
        options.max_rpc_threads));
  }
  if (!options.plan || !options.max_batch) {
    return absl::InvalidArgumentError("the server needs a planner");
  }
  MUTWO_ASSIGN_OR_RETURN(
      auth::ServerSecurity security,
      auth::MakeServerSecurity(options.security, options.listen));
  return std::unique_ptr<MutwoServer>(
      new MutwoServer(std::move(options), std::move(security)));
}

absl::Status MutwoServer::Start() {
  storage::Store::Options store_options;
  store_options.data_dir = options_.data_dir;
  MUTWO_ASSIGN_OR_RETURN(store_, storage::Store::Open(store_options));
  // The per-model gauges of the results already stored, before the first
  // scrape.
  MUTWO_RETURN_IF_ERROR(PublishStoredResults(*store_, server_metrics_));
  MUTWO_ASSIGN_OR_RETURN(
      core_, JobCore::Create(options_.core, store_.get(), &server_metrics_,
                             options_.plan, options_.max_batch));
  authorizer_ =
      std::make_unique<auth::Authorizer>(security_.tokens, store_.get());
  if (security_.processor != nullptr) {
    security_.processor->OnRefusal([this](const char* reason) {
      server_metrics_.CountAuthRefusal(reason);
    });
  }
  planner_service_ = std::make_unique<PlannerService>(
      core_.get(), authorizer_.get(), &server_metrics_,
      options_.core.max_model_bytes);
  hub_service_ = std::make_unique<WorkerHubService>(
      core_.get(), authorizer_.get(), &server_metrics_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, security_.credentials, &port_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  if (options_.max_rpc_threads > 0) {
    grpc::ResourceQuota quota("mutwo-server");
    quota.SetMaxThreads(options_.max_rpc_threads);
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(planner_service_.get());
  builder.RegisterService(hub_service_.get());
  {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(std::make_unique<DefinedStatusInterceptorFactory>());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", options_.listen,
                     "\": address in use or invalid"));
  }
  if (!options_.metrics_listen.empty()) {
    MUTWO_ASSIGN_OR_RETURN(metrics_,
                           StartMetricsEndpoint(options_.metrics_listen,
                                                server_metrics_.registry()));
  }
  core_->Start();
  server_->GetHealthCheckService()->SetServingStatus(true);
  // Scripts parse "(port N), metrics on port M" from this line.
  MUTWO_LOG(info, "listening on {} (port {}), metrics on port {}, data in {}",
            options_.listen, port_, metrics_ != nullptr ? metrics_->port() : 0,
            options_.data_dir);
  MUTWO_LOG(info, "gRPC port security: {}", security_.description);
  return absl::OkStatus();
}

void MutwoServer::Shutdown(absl::Duration drain_timeout) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    // Wakes long polls so they return before the drain deadline.
    if (core_ != nullptr) core_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(drain_timeout));
    server_->Wait();
  }
  if (core_ != nullptr) core_->Shutdown();
  if (metrics_ != nullptr) metrics_->Shutdown();
  metrics_.reset();
  server_.reset();
  core_.reset();
  store_.reset();
}

MutwoServer::~MutwoServer() { Shutdown(absl::Seconds(1)); }

}  // namespace mutwo
