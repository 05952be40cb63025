// Conversions between absl::Status (used inside every manager) and grpc::Status (used only by
// the thin gRPC adapters in server/rpc and worker/agent). The canonical codes are shared, so
// the mapping is one to one; the message is kept verbatim because it names the field and fix.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace loom {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace loom
