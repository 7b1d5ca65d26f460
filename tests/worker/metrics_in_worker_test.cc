// The metrics endpoint inside a process linked with the worker's LibTorch
// (on the GPU build that is LibTorch 2.11 + CUDA, whose static
// TLS made civetweb's 100 KiB thread stacks fail). The endpoint must serve
// here; whether a civetweb-sized thread can start is recorded (the
// `static_tls_check` line and test property) as evidence of the cause.
#include <pthread.h>

#include <cstring>
#include <iostream>
#include <memory>

#include "common/metrics_exposer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/testing/process.h"
#include "torch/torch.h"

namespace mutwo {
namespace {

TEST(MetricsInWorkerProcessTest, EndpointServesBesideLibTorch) {
  // LibTorch is loaded and initialised in this process.
  EXPECT_EQ(torch::ones({2}).sum().item<float>(), 2.0f);

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 102400);  // Debian civetweb's stack size
  pthread_t thread;
  const int rc = pthread_create(
      &thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  pthread_attr_destroy(&attr);
  if (rc == 0) pthread_join(thread, nullptr);
  const std::string result = rc == 0 ? "ok" : std::strerror(rc);
  std::cout << "static_tls_check: pthread_create with a 102400-byte stack "
               "(civetweb's) in this LibTorch process: "
            << result << "\n";
  ::testing::Test::RecordProperty("civetweb_stack_pthread_create", result);

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
              ::testing::HasSubstr("mutwo_test_events_total 1"));
}

}  // namespace
}  // namespace mutwo
