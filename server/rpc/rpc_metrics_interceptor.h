// A server interceptor that counts every RPC by method and resulting status code into
// loom_rpc_requests_total{method, code}, and records its duration on loomd (from the call's
// start to its status being sent) in loom_rpc_duration_seconds{method}. Counting in one place,
// not in each adapter, means no method can be forgotten and streams are counted when they end.
// The clock is the server's (injected), read twice per call.
//
// Label values stay bounded: the method label is the full name of a method loomd serves
// ("/loom.v1.JobService/CreateJob"); anything else, such as a path a client made up, is counted
// as "other".
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "server/metrics/server_metrics.h"

namespace loom::rpc {

// `metrics` and `clock` must outlive the server the factory is installed in. `services` are the
// full names of the services the server registers ("loom.v1.JobService"), whose descriptors must
// be in protobuf's generated pool; gRPC's health checks and server reflection are known too.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory(server_metrics::ServerMetrics* metrics, const Clock* clock,
                                std::vector<std::string> services);

}  // namespace loom::rpc
