// A server interceptor that counts every RPC by method and resulting status code into
// loom_rpc_requests_total{method, code}. Counting in one place, not in each adapter, means no
// method can be forgotten and streams are counted when they end.
//
// Label values stay bounded: the method label is the full name of a method loomd serves
// ("/loom.v1.JobService/CreateJob"); anything else is counted as "other".
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "server/metrics/server_metrics.h"

namespace loom::rpc {

// `metrics` must outlive the server the factory is installed in.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory(server_metrics::ServerMetrics* metrics);

}  // namespace loom::rpc
