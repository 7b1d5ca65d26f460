// MutwoServer owns the gRPC server of mutwo-server: the services, health
// checking (grpc.health.v1: SERVING, NOT_SERVING while draining) and
// reflection. Start() binds and returns; Shutdown(deadline) stops accepting,
// lets in-flight RPCs finish until the deadline and then cancels them.
// Thread-safe: Shutdown may be called from any thread, once.
#ifndef MUTWO_SERVER_SERVER_H_
#define MUTWO_SERVER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"

namespace mutwo {

class MutwoServer {
 public:
  struct Options {
    std::string listen = "127.0.0.1:50051";
    std::string data_dir = "./mutwo-data";
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MutwoServer>> Create(
      Options options);

  // Binds `listen`; the port actually bound (useful with port 0) is port().
  [[nodiscard]] absl::Status Start();
  int port() const { return port_; }
  void Shutdown(absl::Duration drain_timeout);
  ~MutwoServer();

 private:
  explicit MutwoServer(Options options) : options_(std::move(options)) {}
  Options options_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_SERVER_H_
