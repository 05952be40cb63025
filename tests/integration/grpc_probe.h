// Probes of the standard gRPC services every Loom daemon serves, without their generated
// stubs (Debian ships no headers for them): raw calls on the well-known method paths, and the
// replies decoded with protobuf's UnknownFieldSet.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::testing {

// grpc.health.v1.Health/Check for `service` ("" = the whole server): the ServingStatus number
// (1 = SERVING, 2 = NOT_SERVING, 3 = SERVICE_UNKNOWN).
absl::StatusOr<int> HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service);

// The service names listed by grpc.reflection.v1alpha.ServerReflection (list_services).
absl::StatusOr<std::vector<std::string>> ReflectionListServices(
    const std::shared_ptr<grpc::Channel>& channel);

}  // namespace loom::testing
