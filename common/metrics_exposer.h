// MetricsEndpoint: the Prometheus /metrics HTTP endpoint of mutwo-server and
// mutwo-worker, on its own port. It answers GET (and HEAD) /metrics with the
// text exposition format (prometheus-cpp's TextSerializer over the registry);
// any other path is 404, any other method 405. One connection at a time,
// closed after each response: Prometheus scrapes every few seconds.
//
// Why not prometheus::Exposer: it wraps civetweb, which Debian builds with
// CIVETWEB_THREAD_STACK_SIZE=102400, so civetweb creates every thread with a
// 100 KiB stack. glibc carves a thread's static TLS (the TLS of every library
// loaded at start) out of that stack and pthread_create fails with EINVAL
// when it does not fit. A process linked with LibTorch 2.11 + CUDA has more
// static TLS than that, so in mutwo-worker civetweb's mg_start returned
// NULL ("null context when constructing CivetServer. Possible problem
// binding to port.") on every port. This endpoint's thread has the default
// stack size, which glibc sizes to hold the static TLS.
//
// Errors name the address and the cause:
//   metrics: cannot listen on "127.0.0.1:9465": port 9465 is already in use
//   by another process (bind: Address already in use); stop it or choose
//   another --metrics_listen
//
// Thread safety: Create/Start/Shutdown from one owner; port() from any
// thread. The destructor shuts the endpoint down.
#ifndef MUTWO_COMMON_METRICS_EXPOSER_H_
#define MUTWO_COMMON_METRICS_EXPOSER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"

namespace mutwo {

class MetricsEndpoint {
 public:
  struct Options {
    // "host:port", "[ipv6]:port", ":port" or "port" (the last two: every
    // IPv4 interface). Port 0 binds an ephemeral port (tests).
    std::string listen;
    std::shared_ptr<prometheus::Collectable> registry;
    // A client that sends or reads nothing for this long is dropped.
    int64_t io_timeout_ms = 5000;
    // Request line and headers; a longer request gets 431.
    int64_t max_request_bytes = 16 * 1024;
  };

  // Resolves, binds and listens (no thread yet). InvalidArgument for a
  // malformed address, AlreadyExists naming the port when another process
  // holds it, Unavailable when it cannot be bound otherwise; the message
  // names the address and the OS error.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Create(
      Options options);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Starts the serving thread. Internal error (naming the cause) when the
  // thread cannot be created.
  [[nodiscard]] absl::Status Start();
  // Stops serving and closes the socket; a scrape in progress finishes
  // first (it is bounded by io_timeout_ms). Idempotent.
  void Shutdown();

  // The bound port (the ephemeral one for port 0).
  int port() const { return port_; }

 private:
  MetricsEndpoint(Options options, int listen_fd, int port, int wake_read_fd,
                  int wake_write_fd);
  void Serve();
  void HandleConnection(int fd);
  std::string Response(const std::string& request) const;

  const Options options_;
  const int listen_fd_;
  const int port_;
  // A byte written here wakes the serving thread's poll() for Shutdown.
  const int wake_read_fd_;
  const int wake_write_fd_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

// Create() then Start(): what mutwo-server and `mutwo-worker serve` call for
// --metrics_listen.
[[nodiscard]] absl::StatusOr<std::unique_ptr<MetricsEndpoint>>
StartMetricsEndpoint(const std::string& listen,
                     std::shared_ptr<prometheus::Collectable> registry);

}  // namespace mutwo

#endif  // MUTWO_COMMON_METRICS_EXPOSER_H_
