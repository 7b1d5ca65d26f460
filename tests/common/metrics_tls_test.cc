// The metrics endpoint in a process with more static TLS than a 100 KiB
// thread stack holds, as mutwo-worker linked with LibTorch 2.11 + CUDA has
// (a civetweb thread could not start there). This binary links
// testing/big_tls.cc (128 KiB of TLS).
#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "common/metrics_exposer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "tests/testing/process.h"

extern "C" size_t MutwoBigTlsBytes();

namespace mutwo {
namespace {

using ::testing::HasSubstr;

// The stack size Debian's civetweb 1.15 gives every thread it creates
// (CIVETWEB_THREAD_STACK_SIZE; `objdump -d libcivetweb.so.1` shows
// `mov $0x19000,%esi` before each pthread_attr_setstacksize call).
constexpr size_t kCivetwebStackBytes = 102400;

int CreateThreadWithStack(size_t stack_bytes) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes);
  pthread_t thread;
  const int rc = pthread_create(
      &thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  pthread_attr_destroy(&attr);
  if (rc == 0) pthread_join(thread, nullptr);
  return rc;
}

// The condition of the issue holds in this process: glibc cannot fit the
// static TLS into a civetweb-sized stack. (Without it the tests below would
// prove nothing.)
TEST(MetricsEndpointLargeTlsTest, ProcessReproducesTheCondition) {
  ASSERT_GE(MutwoBigTlsBytes(), 128u * 1024);
  EXPECT_EQ(CreateThreadWithStack(kCivetwebStackBytes), EINVAL)
      << "pthread_create with a 100 KiB stack should fail here";
  EXPECT_EQ(CreateThreadWithStack(1 << 20), 0);
}

// What the worker hit: prometheus::Exposer (civetweb) cannot start.
TEST(MetricsEndpointLargeTlsTest, CivetwebExposerFailsHere) {
  std::string error;
  try {
    prometheus::Exposer exposer("127.0.0.1:0", 1);
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_THAT(error, HasSubstr("null context when constructing CivetServer"));
}

TEST(MetricsEndpointLargeTlsTest, EndpointServes) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("mutwo_test_events_total")
      .Help("Events")
      .Register(*registry)
      .Add({})
      .Increment();
  auto endpoint = StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_THAT(testing::HttpGet((*endpoint)->port(), "/metrics"),
              HasSubstr("mutwo_test_events_total 1"));
}

}  // namespace
}  // namespace mutwo
