// Every reply a defined status. gRPC answers a request that does
// not parse as its message type with INTERNAL and an empty message (the
// proto3 message's empty InitializationErrorString) before any handler runs;
// a fuzzer saw that for ~40% of its requests. This server interceptor turns
// exactly that reply into INVALID_ARGUMENT naming the method, so a client
// can tell its own malformed input from a server fault. The callback-API
// methods (LeaseTask, ReportProfile, WatchJob) answer the same unparsable
// request with UNIMPLEMENTED and an empty message instead; that, for those
// methods only, is turned into the same INVALID_ARGUMENT.
//
// Thread safety: one interceptor per call, as gRPC creates them.
#ifndef MUTWO_SERVER_DEFINED_STATUS_H_
#define MUTWO_SERVER_DEFINED_STATUS_H_

#include <string>

#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"

namespace mutwo {

// The status sent for `status` of a call of `method` (unchanged unless it is
// an INTERNAL without a message, or an UNIMPLEMENTED without a message from
// a callback-API method).
grpc::Status DefinedStatus(const grpc::Status& status,
                           const std::string& method);

class DefinedStatusInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_DEFINED_STATUS_H_
