#include "server/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
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

// Why gRPC could not bind `listen` (it only logs the cause): bind the
// address once more ourselves, without SO_REUSEPORT, and name what the OS
// says. AlreadyExists when the port is in use, InvalidArgument otherwise.
absl::Status ListenFailure(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  const std::string port =
      colon == std::string::npos ? listen : listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port_number = -1;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 ||
      port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot listen on \"", listen,
        "\": expected host:port with a port in [0, 65535] (--listen)"));
  }
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const int gai =
      getaddrinfo(host.empty() || host == "0.0.0.0" ? nullptr : host.c_str(),
                  port.c_str(), &hints, &addrs);
  if (gai != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on \"", listen, "\": resolve \"", host,
                     "\": ", gai_strerror(gai), " (--listen)"));
  }
  std::string why = "gRPC could not bind it";
  bool in_use = false;
  for (addrinfo* a = addrs; a != nullptr && !in_use; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      in_use = errno == EADDRINUSE;
      why = absl::StrCat("bind: ", std::strerror(errno));
    }
    close(fd);
  }
  freeaddrinfo(addrs);
  if (in_use) {
    return absl::AlreadyExistsError(absl::StrCat(
        "cannot listen on \"", listen, "\": port ", port_number,
        " is already in use by another process (another mutwo-server?); "
        "stop it or choose another --listen"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot listen on \"", listen, "\": ", why, " (--listen)"));
}
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

absl::StatusOr<std::unique_ptr<PrincipalLimits>> MutwoServer::LimitPerPrincipal(
    const std::string& what, const std::string& flag_name, int max) {
  PrincipalLimits::Options limits;
  limits.what = what;
  limits.flag = "--" + flag_name;
  limits.max_per_principal = max;
  limits.retry_after_ms = options_.core.waiter_retry_after_ms;
  // Refusals are counted under the flag's name.
  limits.observe_refused = [this, flag_name] {
    server_metrics_.CountLimitRefusal(flag_name);
  };
  return PrincipalLimits::Create(std::move(limits));
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
  MUTWO_ASSIGN_OR_RETURN(watches_per_client_,
                         LimitPerPrincipal("watches", "max_watchers_per_client",
                                           options_.max_watchers_per_client));
  MUTWO_ASSIGN_OR_RETURN(
      lease_polls_per_worker_,
      LimitPerPrincipal("lease polls", "max_lease_waiters_per_worker",
                        options_.max_lease_waiters_per_worker));
  UploadQuota::Options quota;
  quota.max_stored_bytes_per_client =
      options_.max_stored_model_bytes_per_client;
  quota.overrides = options_.model_quota_overrides;
  quota.observe_refused = [this] {
    server_metrics_.CountLimitRefusal("max_stored_model_bytes_per_client");
  };
  stored_models_ =
      std::make_unique<UploadQuota>(std::move(quota), store_.get());
  UploadWatchdog::Options idle;
  idle.idle_timeout_ms = options_.upload_idle_timeout_ms;
  idle.observe_dropped = [this] {
    server_metrics_.CountLimitRefusal("upload_idle_timeout_ms");
  };
  MUTWO_ASSIGN_OR_RETURN(idle_uploads_,
                         UploadWatchdog::Create(std::move(idle)));
  planner_service_ = std::make_unique<PlannerService>(
      core_.get(), authorizer_.get(), &server_metrics_,
      options_.core.max_model_bytes,
      PlannerService::Limits{watches_per_client_.get(), stored_models_.get(),
                             idle_uploads_.get()});
  WorkerQuarantine::Options quarantine;
  quarantine.max_failures = options_.worker_quarantine_failures;
  quarantine.window_ms = options_.worker_quarantine_window_ms;
  quarantine.quarantine_ms = options_.worker_quarantine_ms;
  quarantine.observe_quarantined = [this](int n) {
    server_metrics_.SetWorkersQuarantined(n);
  };
  quarantine.observe_new = [this] { server_metrics_.CountWorkerQuarantined(); };
  MUTWO_ASSIGN_OR_RETURN(quarantine_,
                         WorkerQuarantine::Create(std::move(quarantine)));
  core_->leasing().SetLeaseCheck([this](const std::string& worker_id) {
    return quarantine_->CheckLease(worker_id);
  });
  MUTWO_ASSIGN_OR_RETURN(
      planning_, PlanningPool::Create(
                     {options_.planning_threads, options_.max_queued_reports}));
  hub_service_ = std::make_unique<WorkerHubService>(
      core_.get(), authorizer_.get(), &server_metrics_,
      lease_polls_per_worker_.get(), quarantine_.get(), planning_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT on its listeners by default: a second server on
  // the same port would then bind without an error and the kernel would
  // split the connections between two servers with two databases.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
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
    if (server_ != nullptr) {
      server_->Shutdown();
      server_.reset();
    }
    return ListenFailure(options_.listen);
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
    // Wakes long polls so they return before the drain deadline, and stops
    // the planning of profile reports in flight (within a planner step):
    // their calls are answered UNAVAILABLE, nothing of them stored.
    if (core_ != nullptr) core_->Shutdown();
    if (planning_ != nullptr) planning_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(drain_timeout));
    server_->Wait();
  }
  if (core_ != nullptr) core_->Shutdown();
  if (planning_ != nullptr) {
    planning_->Stop();
    planning_->Join();
  }
  if (metrics_ != nullptr) metrics_->Shutdown();
  metrics_.reset();
  server_.reset();
  core_.reset();
  store_.reset();
}

MutwoServer::~MutwoServer() { Shutdown(absl::Seconds(1)); }

}  // namespace mutwo
