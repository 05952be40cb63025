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
  RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info,
                        server_metrics::ServerMetrics* metrics)
      : method_(MethodLabel(info->method())), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->RecordRpc(method_, server_metrics::ServerMetrics::CodeName(
                                       static_cast<int>(methods->GetSendStatus().error_code())));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  server_metrics::ServerMetrics* const metrics_;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(server_metrics::ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info, metrics_);
  }

 private:
  server_metrics::ServerMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory(server_metrics::ServerMetrics* metrics) {
  return std::make_unique<Factory>(metrics);
}

}  // namespace loom::rpc
