#include "common/metrics_exposer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "prometheus/text_serializer.h"

namespace mutwo {
namespace {

constexpr int kListenBacklog = 16;

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

absl::Status ListenError(const std::string& listen, absl::string_view why) {
  return absl::UnavailableError(
      absl::StrCat("metrics: cannot listen on \"", listen, "\": ", why));
}

struct HostPort {
  std::string host;  // empty: every IPv4 interface
  std::string port;
};

absl::StatusOr<HostPort> SplitListen(const std::string& listen) {
  HostPort hp;
  if (absl::StartsWith(listen, "[")) {
    const size_t close = listen.find("]:");
    if (close == std::string::npos) {
      return absl::InvalidArgumentError("");
    }
    hp.host = listen.substr(1, close - 1);
    hp.port = listen.substr(close + 2);
  } else if (const size_t colon = listen.rfind(':');
             colon != std::string::npos) {
    hp.host = listen.substr(0, colon);
    hp.port = listen.substr(colon + 1);
  } else {
    hp.port = listen;
  }
  int port = -1;
  if (hp.port.empty() || !absl::SimpleAtoi(hp.port, &port) || port < 0 ||
      port > 65535 || hp.host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError("");
  }
  return hp;
}

void SetTimeout(int fd, int option, int64_t ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  (void)setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    // MSG_NOSIGNAL: a scraper that hangs up must not SIGPIPE the process.
    const ssize_t n =
        send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Half-closes and reads what the client still sends for a moment: closing a
// socket with unread input sends a reset, which can discard the response
// before the client reads it.
void LingeringClose(int fd) {
  (void)shutdown(fd, SHUT_WR);
  SetTimeout(fd, SO_RCVTIMEO, 200);
  char buf[4096];
  for (int i = 0; i < 64; ++i) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
  }
}

std::string HttpResponse(const std::string& status,
                         const std::string& content_type,
                         const std::string& body, bool include_body,
                         const std::string& extra_headers = "") {
  std::string out =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n", extra_headers, "\r\n");
  if (include_body) out += body;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Create(
    Options options) {
  const std::string& listen = options.listen;
  if (options.registry == nullptr) {
    return absl::InvalidArgumentError("metrics: no registry to expose");
  }
  absl::StatusOr<HostPort> hp = SplitListen(listen);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: cannot listen on \"", listen,
                     "\": expected host:port, [ipv6]:port, :port or port"));
  }
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = hp->host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const int gai = getaddrinfo(hp->host.empty() ? nullptr : hp->host.c_str(),
                              hp->port.c_str(), &hints, &addrs);
  if (gai != 0) {
    return ListenError(listen, absl::StrCat("resolve \"", hp->host,
                                            "\": ", gai_strerror(gai)));
  }
  int fd = -1;
  std::string error = "no address";
  bool in_use = false;
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    // CLOEXEC: the worker forks task processes, which must not hold the
    // port open after the worker exits.
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                a->ai_protocol);
    if (fd < 0) {
      error = Errno("socket");
      continue;
    }
    const int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      in_use = in_use || errno == EADDRINUSE;
      error = Errno("bind");
    } else if (::listen(fd, kListenBacklog) != 0) {
      error = Errno("listen");
    } else {
      break;
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(addrs);
  if (fd < 0 && in_use) {
    // Another process holds the port: the operator's choice of port is
    // wrong, as for the gRPC --listen port (AlreadyExists there too).
    return absl::AlreadyExistsError(
        absl::StrCat("metrics: cannot listen on \"", listen, "\": port ",
                     hp->port, " is already in use by another process (", error,
                     "); stop it or choose another --metrics_listen"));
  }
  if (fd < 0) return ListenError(listen, error);

  sockaddr_storage bound;
  socklen_t len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    error = Errno("getsockname");
    close(fd);
    return ListenError(listen, error);
  }
  const int port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    error = Errno("pipe");
    close(fd);
    return ListenError(listen, error);
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(options), fd, port, wake[0], wake[1]));
}

MetricsEndpoint::MetricsEndpoint(Options options, int listen_fd, int port,
                                 int wake_read_fd, int wake_write_fd)
    : options_(std::move(options)),
      listen_fd_(listen_fd),
      port_(port),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd) {}

MetricsEndpoint::~MetricsEndpoint() {
  Shutdown();
  close(listen_fd_);
  close(wake_read_fd_);
  close(wake_write_fd_);
}

absl::Status MetricsEndpoint::Start() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    return absl::FailedPreconditionError("metrics: endpoint is shut down");
  }
  if (thread_.joinable()) return absl::OkStatus();
  try {
    thread_ = std::thread([this] { Serve(); });
  } catch (const std::system_error& e) {
    return absl::InternalError(
        absl::StrCat("metrics: cannot start the thread serving \"",
                     options_.listen, "\": ", e.what()));
  }
  return absl::OkStatus();
}

void MetricsEndpoint::Shutdown() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    thread = std::move(thread_);
  }
  const char byte = 1;
  (void)!write(wake_write_fd_, &byte, 1);
  if (thread.joinable()) thread.join();
}

void MetricsEndpoint::Serve() {
  pollfd fds[2];
  fds[0] = {listen_fd_, POLLIN, 0};
  fds[1] = {wake_read_fd_, POLLIN, 0};
  while (true) {
    fds[0].revents = fds[1].revents = 0;
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      MUTWO_LOG(error, "metrics on port {}: {}; no longer serving", port_,
                Errno("poll"));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Out of descriptors: back off instead of spinning on poll().
        MUTWO_LOG(warn, "metrics on port {}: {}", port_, Errno("accept"));
        poll(nullptr, 0, 100);
      }
      continue;
    }
    HandleConnection(fd);
    close(fd);
  }
}

void MetricsEndpoint::HandleConnection(int fd) {
  SetTimeout(fd, SO_RCVTIMEO, options_.io_timeout_ms);
  SetTimeout(fd, SO_SNDTIMEO, options_.io_timeout_ms);
  std::string request;
  char buf[4096];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (static_cast<int64_t>(request.size()) > options_.max_request_bytes) {
      (void)SendAll(
          fd, HttpResponse("431 Request Header Fields Too Large", "text/plain",
                           "request too large\n", true));
      LingeringClose(fd);
      return;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, or timed out before a full request
    request.append(buf, static_cast<size_t>(n));
  }
  (void)SendAll(fd, Response(request));
  LingeringClose(fd);
}

std::string MetricsEndpoint::Response(const std::string& request) const {
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
    return HttpResponse("400 Bad Request", "text/plain",
                        "expected: GET /metrics HTTP/1.1\n", true);
  }
  const std::string& method = parts[0];
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    return HttpResponse("405 Method Not Allowed", "text/plain",
                        "only GET and HEAD\n", true, "Allow: GET, HEAD\r\n");
  }
  if (path != "/metrics") {
    return HttpResponse("404 Not Found", "text/plain",
                        "mutwo serves Prometheus metrics at /metrics\n", !head);
  }
  std::string body;
  try {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, options_.registry->Collect());
    body = out.str();
  } catch (const std::exception& e) {
    return HttpResponse("500 Internal Server Error", "text/plain",
                        absl::StrCat("collecting metrics: ", e.what(), "\n"),
                        !head);
  }
  return HttpResponse("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                      body, !head);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& listen,
    std::shared_ptr<prometheus::Collectable> registry) {
  MetricsEndpoint::Options options;
  options.listen = listen;
  options.registry = std::move(registry);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Create(std::move(options));
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status s = (*endpoint)->Start(); !s.ok()) return s;
  return endpoint;
}

}  // namespace mutwo
