// How loomctl reaches loomd: the address, TLS and the bearer token, in one place so that every
// command gets them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/scaling.grpc.pb.h"

namespace loom::client {

inline constexpr char kDefaultServer[] = "127.0.0.1:7070";

// The server address: `flag` when given, else $LOOM_SERVER when set and not empty, else
// kDefaultServer.
std::string ResolveServerAddress(const std::string& flag);

// The bearer token: `flag` when given, else the first line of the file `file_flag` (or
// $LOOM_TOKEN_FILE), else $LOOM_TOKEN; empty when none is set.
absl::StatusOr<std::string> ResolveToken(const std::string& flag, const std::string& file_flag);

// A connection to one loomd. Unary calls carry `rpc_timeout` as their deadline and fail fast
// (UNAVAILABLE) when the server cannot be reached; streams have no deadline.
class Connection {
 public:
  // Plaintext, no token (tests against a local fake).
  Connection(std::string server, absl::Duration rpc_timeout);
  // With `credentials` (common/tls.h) and, when not empty, `token` sent as
  // "authorization: Bearer TOKEN" on every call.
  Connection(std::string server, absl::Duration rpc_timeout,
             std::shared_ptr<grpc::ChannelCredentials> credentials, std::string token);

  const std::string& server() const { return server_; }
  loom::v1::JobService::StubInterface& jobs() { return *jobs_; }
  loom::v1::NodeService::StubInterface& nodes() { return *nodes_; }
  loom::v1::ScalingService::StubInterface& scaling() { return *scaling_; }

  // Sets the deadline of a unary call on `context`, and its credentials.
  void PrepareUnary(grpc::ClientContext* context) const;
  // Sets the credentials of a streaming call (no deadline).
  void PrepareStream(grpc::ClientContext* context) const;

 private:
  std::string server_;
  absl::Duration rpc_timeout_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::NodeService::Stub> nodes_;
  std::unique_ptr<loom::v1::ScalingService::Stub> scaling_;
};

}  // namespace loom::client
