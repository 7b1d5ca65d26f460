// Conversion between absl::Status and grpc::Status at the RPC edge. Codes map
// one to one; messages are cut to 1 KiB so a huge error never becomes a huge
// trailer.
#ifndef MUTWO_COMMON_GRPC_STATUS_H_
#define MUTWO_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace mutwo {

inline constexpr size_t kMaxStatusMessageBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace mutwo

#endif  // MUTWO_COMMON_GRPC_STATUS_H_
