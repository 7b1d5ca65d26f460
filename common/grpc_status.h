// Conversion between absl::Status and grpc::Status at the RPC edge. Codes map
// one to one; messages are cut to 1 KiB so a huge error never becomes a huge
// trailer.
#ifndef MUTWO_COMMON_GRPC_STATUS_H_
#define MUTWO_COMMON_GRPC_STATUS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace mutwo {

inline constexpr size_t kMaxStatusMessageBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The server's retry hint of a finished call: grpc-retry-pushback-ms in its
// trailers (mutwo-server sends it with RESOURCE_EXHAUSTED when too many long
// waits are open). nullopt when absent or not a non-negative number.
std::optional<int64_t> RetryPushbackMs(const grpc::ClientContext& context);

}  // namespace mutwo

#endif  // MUTWO_COMMON_GRPC_STATUS_H_
