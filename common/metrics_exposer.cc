#include "common/metrics_exposer.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace mutwo {

absl::StatusOr<MetricsEndpoint> StartMetricsEndpoint(
    const std::string& listen,
    const std::shared_ptr<prometheus::Registry>& registry) {
  MetricsEndpoint endpoint;
  try {
    // One thread is plenty for a scrape every few seconds.
    endpoint.exposer = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on \"", listen, "\": ", e.what()));
  }
  endpoint.exposer->RegisterCollectable(registry);
  const auto ports = endpoint.exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics: no port bound for \"", listen, "\""));
  }
  endpoint.port = ports.front();
  return endpoint;
}

}  // namespace mutwo
