#include "server/rpc/rpc_metrics_interceptor.h"

#include <string>
#include <string_view>

namespace loom::rpc {
namespace {

std::string MethodLabel(const char* method) {
  std::string_view m = method == nullptr ? "" : method;
  if (m.size() <= 128 && (m.starts_with("/loom.v1.") || m.starts_with("/grpc."))) {
    return std::string(m);
  }
  return "other";
}

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  // gRPC makes the interceptors of a call when the call starts on the server (its initial
  // metadata is in; its message may not be yet): the start of the duration recorded.
  RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info,
                        server_metrics::ServerMetrics* metrics, const Clock* clock)
      : method_(MethodLabel(info->method())),
        metrics_(metrics),
        clock_(clock),
        start_(clock->Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->RecordRpc(method_, static_cast<int>(methods->GetSendStatus().error_code()),
                          clock_->Now() - start_);
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  server_metrics::ServerMetrics* const metrics_;
  const Clock* const clock_;
  const absl::Time start_;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  Factory(server_metrics::ServerMetrics* metrics, const Clock* clock)
      : metrics_(metrics), clock_(clock) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info, metrics_, clock_);
  }

 private:
  server_metrics::ServerMetrics* const metrics_;
  const Clock* const clock_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory(server_metrics::ServerMetrics* metrics, const Clock* clock) {
  return std::make_unique<Factory>(metrics, clock);
}

}  // namespace loom::rpc
