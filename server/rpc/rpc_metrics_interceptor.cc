#include "server/rpc/rpc_metrics_interceptor.h"

#include <google/protobuf/descriptor.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loom::rpc {
namespace {

// The full paths ("/loom.v1.JobService/CreateJob") of the methods of `services`, of gRPC's
// health checks and of server reflection. Built once: a client chooses the path it calls, and
// gRPC hands an unknown one to the interceptors as it came (an UNIMPLEMENTED call).
absl::flat_hash_set<std::string> KnownMethods(std::vector<std::string> services) {
  // Health is served by gRPC's own code, without a descriptor in the generated pool.
  absl::flat_hash_set<std::string> known = {"/grpc.health.v1.Health/Check",
                                            "/grpc.health.v1.Health/Watch"};
  services.push_back("grpc.reflection.v1alpha.ServerReflection");
  for (const std::string& name : services) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      known.insert(absl::StrCat("/", service->full_name(), "/", service->method(i)->name()));
    }
  }
  return known;
}

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  // gRPC makes the interceptors of a call when the call starts on the server (its initial
  // metadata is in; its message may not be yet): the start of the duration recorded.
  RpcMetricsInterceptor(std::string method, server_metrics::ServerMetrics* metrics,
                        const Clock* clock)
      : method_(std::move(method)), metrics_(metrics), clock_(clock), start_(clock->Now()) {}

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
  Factory(server_metrics::ServerMetrics* metrics, const Clock* clock,
          std::vector<std::string> services)
      : known_(KnownMethods(std::move(services))), metrics_(metrics), clock_(clock) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const absl::string_view method = info->method() == nullptr ? "" : info->method();
    return new RpcMetricsInterceptor(known_.contains(method) ? std::string(method) : "other",
                                     metrics_, clock_);
  }

 private:
  const absl::flat_hash_set<std::string> known_;  // never changed: read by every call's thread
  server_metrics::ServerMetrics* const metrics_;
  const Clock* const clock_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory(server_metrics::ServerMetrics* metrics, const Clock* clock,
                                std::vector<std::string> services) {
  return std::make_unique<Factory>(metrics, clock, std::move(services));
}

}  // namespace loom::rpc
