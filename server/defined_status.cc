#include "server/defined_status.h"

#include "absl/strings/str_cat.h"

namespace mutwo {
namespace {

class DefinedStatusInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit DefinedStatusInterceptor(std::string method)
      : method_(std::move(method)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status sent = methods->GetSendStatus();
      const grpc::Status defined = DefinedStatus(sent, method_);
      if (defined.error_code() != sent.error_code()) {
        methods->ModifySendStatus(defined);
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

}  // namespace

grpc::Status DefinedStatus(const grpc::Status& status,
                           const std::string& method) {
  // The methods on the callback API (server/services.h): gRPC fails their
  // unparsable requests with UNIMPLEMENTED before any handler runs.
  const bool callback_method = method == "/mutwo.v1.WorkerHub/LeaseTask" ||
                               method == "/mutwo.v1.WorkerHub/ReportProfile" ||
                               method == "/mutwo.v1.Planner/WatchJob";
  const bool unparsed =
      status.error_code() == grpc::StatusCode::INTERNAL ||
      (callback_method &&
       status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  if (!unparsed || !status.error_message().empty()) return status;
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat(method.empty() ? std::string("the call") : method,
                   ": the request does not parse as the method's message "
                   "type (see proto/mutwo/v1/)"));
}

grpc::experimental::Interceptor*
DefinedStatusInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new DefinedStatusInterceptor(info->method() != nullptr ? info->method()
                                                                : "");
}

}  // namespace mutwo
