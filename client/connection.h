// How loomctl reaches loomd. One place, so that TLS and bearer tokens (a later issue) are added
// here and every command gets them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::client {

inline constexpr char kDefaultServer[] = "127.0.0.1:7070";

// The server address: `flag` when given, else $LOOM_SERVER when set and not empty, else
// kDefaultServer.
std::string ResolveServerAddress(const std::string& flag);

// A connection to one loomd. Unary calls carry `rpc_timeout` as their deadline and fail fast
// (UNAVAILABLE) when the server cannot be reached; streams have no deadline.
class Connection {
 public:
  Connection(std::string server, absl::Duration rpc_timeout);

  const std::string& server() const { return server_; }
  loom::v1::JobService::StubInterface& jobs() { return *jobs_; }
  loom::v1::NodeService::StubInterface& nodes() { return *nodes_; }

  // Sets the deadline of a unary call on `context`.
  void PrepareUnary(grpc::ClientContext* context) const;

 private:
  std::string server_;
  absl::Duration rpc_timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::NodeService::Stub> nodes_;
};

}  // namespace loom::client
