// Starts the Prometheus /metrics HTTP endpoint (prometheus-cpp's civetweb
// exposer) on its own port. Port 0 binds an ephemeral port (tests); the bound
// port is returned. Binding errors become absl::Status instead of exceptions.
#ifndef MUTWO_COMMON_METRICS_EXPOSER_H_
#define MUTWO_COMMON_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace mutwo {

struct MetricsEndpoint {
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
};

[[nodiscard]] absl::StatusOr<MetricsEndpoint> StartMetricsEndpoint(
    const std::string& listen,
    const std::shared_ptr<prometheus::Registry>& registry);

}  // namespace mutwo

#endif  // MUTWO_COMMON_METRICS_EXPOSER_H_
