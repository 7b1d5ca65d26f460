#include "common/metrics_exposer.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/testing/process.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;
using testing::HttpExchange;
using testing::HttpGet;
using ::testing::Not;
using testing::OccupiedPort;
using ::testing::StartsWith;

std::shared_ptr<prometheus::Registry> RegistryWithCounter() {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("mutwo_test_events_total")
      .Help("Events")
      .Register(*registry)
      .Add({{"kind", "a"}})
      .Increment(3);
  return registry;
}

TEST(MetricsEndpointTest, ServesTheRegistryInTextFormat) {
  auto endpoint = StartMetricsEndpoint("127.0.0.1:0", RegistryWithCounter());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);
  const std::string response = HttpExchange(
      port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(response, HasSubstr("# TYPE mutwo_test_events_total counter\n"));
  EXPECT_THAT(response, HasSubstr("mutwo_test_events_total{kind=\"a\"} 3"));
  // The length header counts the body exactly (Prometheus relies on it).
  const size_t body = response.find("\r\n\r\n") + 4;
  EXPECT_THAT(response,
              HasSubstr(absl::StrCat("Content-Length: ", response.size() - body,
                                     "\r\n")));
  // A query string is ignored; scrapes repeat.
  EXPECT_THAT(HttpGet(port, "/metrics?x=1"),
              HasSubstr("mutwo_test_events_total{kind=\"a\"} 3"));
}

TEST(MetricsEndpointTest, OtherPathsMethodsAndBadRequests) {
  auto endpoint = StartMetricsEndpoint("127.0.0.1:0", RegistryWithCounter());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_THAT(HttpExchange(port, "GET / HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(HttpExchange(port, "POST /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(HttpExchange(port, "hello\r\n\r\n"),
              StartsWith("HTTP/1.1 400 Bad Request"));
  const std::string head = HttpExchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_THAT(head, Not(HasSubstr("mutwo_test_events_total")));
  EXPECT_THAT(HttpExchange(port, "GET /metrics HTTP/1.1\r\nX: " +
                                     std::string(64 * 1024, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.1 431"));
  // Still serving after the bad requests.
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("mutwo_test_events_total"));
}

TEST(MetricsEndpointTest, OccupiedPortNamesThePortAndTheOsReason) {
  OccupiedPort taken;
  const std::string listen = absl::StrCat("127.0.0.1:", taken.port());
  auto endpoint = StartMetricsEndpoint(listen, RegistryWithCounter());
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(endpoint.status().message(),
            absl::StrCat("metrics: cannot listen on \"", listen, "\": port ",
                         taken.port(),
                         " is already in use by another process (bind: "
                         "Address already in use); stop it or choose another "
                         "--metrics_listen"));
}

TEST(MetricsEndpointTest, MalformedAndUnresolvableAddresses) {
  for (const char* listen : {"", "127.0.0.1:", "127.0.0.1:http", ":70000",
                             "::1:9465", "[::1]9465"}) {
    auto endpoint = StartMetricsEndpoint(listen, RegistryWithCounter());
    ASSERT_FALSE(endpoint.ok()) << listen;
    EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument)
        << listen;
    EXPECT_THAT(
        endpoint.status().message(),
        HasSubstr(absl::StrCat("\"", listen, "\": expected host:port")));
  }
  auto endpoint =
      StartMetricsEndpoint("no-such-host.invalid:0", RegistryWithCounter());
  ASSERT_FALSE(endpoint.ok());
  EXPECT_THAT(endpoint.status().message(),
              HasSubstr("cannot listen on \"no-such-host.invalid:0\": "
                        "resolve \"no-such-host.invalid\": "));
}

TEST(MetricsEndpointTest, PortOnlyFormsListenOnEveryInterface) {
  for (const char* listen : {"0", ":0"}) {
    auto endpoint = StartMetricsEndpoint(listen, RegistryWithCounter());
    ASSERT_TRUE(endpoint.ok()) << listen << ": " << endpoint.status();
    EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics"),
                HasSubstr("mutwo_test_events_total"))
        << listen;
  }
}

TEST(MetricsEndpointTest, ShutdownFreesThePort) {
  auto endpoint = StartMetricsEndpoint("127.0.0.1:0", RegistryWithCounter());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  (*endpoint)->Shutdown();
  (*endpoint)->Shutdown();  // idempotent
  endpoint->reset();
  EXPECT_EQ(HttpExchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), "");
  // The same port can be bound again at once.
  auto again = StartMetricsEndpoint(absl::StrCat("127.0.0.1:", port),
                                    RegistryWithCounter());
  EXPECT_TRUE(again.ok()) << again.status();
}

}  // namespace
}  // namespace mutwo
