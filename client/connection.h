// How loomctl reaches loomd: the address, TLS and the bearer token, in one place so that every
// command gets them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/wire_client.h"
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

// How a plaintext connection makes the unary calls of scripts (CreateJob, GetJob, ListJobs,
// CancelJob): on the wire without gRPC's runtime (client/wire_client.h), or through gRPC.
enum class UnaryTransport { kWire, kGrpc };

// A connection to one loomd. Unary calls carry `rpc_timeout` as their deadline and fail fast
// (UNAVAILABLE) when the server cannot be reached; streams have no deadline.
//
// gRPC's channel (and with it gRPC's runtime: its threads and pollers) is made on the first use
// of jobs(), nodes() or scaling(), not before: a plaintext `loomctl submit`, `get`, `list` or
// `cancel` never starts it. Thread-safe: jobs() and the other stubs from any thread; the wire
// calls one at a time (a mutex).
class Connection {
 public:
  // Plaintext (loopback, or --insecure), with `token` sent as "authorization: Bearer TOKEN"
  // when not empty.
  Connection(std::string server, absl::Duration rpc_timeout, std::string token = "",
             UnaryTransport transport = UnaryTransport::kWire);
  // TLS: the unary calls of scripts on the wire, verifying the server with `wire_tls`; the rest
  // through gRPC with the credentials `make_credentials` returns when the channel is first
  // needed (making them starts gRPC's runtime). Both describe the same TLS files.
  Connection(std::string server, absl::Duration rpc_timeout, std::string token, WireTls wire_tls,
             std::function<std::shared_ptr<grpc::ChannelCredentials>()> make_credentials);
  // With `credentials` (common/tls.h): every call goes through gRPC.
  Connection(std::string server, absl::Duration rpc_timeout,
             std::shared_ptr<grpc::ChannelCredentials> credentials, std::string token);
  ~Connection();

  const std::string& server() const { return server_; }
  loom::v1::JobService::StubInterface& jobs();
  loom::v1::NodeService::StubInterface& nodes();
  loom::v1::ScalingService::StubInterface& scaling();

  // The unary calls of scripts: on the wire when this connection is plaintext, else jobs().
  // `context` carries the deadline (PrepareUnary); the token is the connection's.
  grpc::Status CreateJob(grpc::ClientContext* context, const loom::v1::CreateJobRequest& request,
                         loom::v1::Job* response);
  grpc::Status GetJob(grpc::ClientContext* context, const loom::v1::GetJobRequest& request,
                      loom::v1::Job* response);
  grpc::Status ListJobs(grpc::ClientContext* context, const loom::v1::ListJobsRequest& request,
                        loom::v1::ListJobsResponse* response);
  grpc::Status CancelJob(grpc::ClientContext* context, const loom::v1::CancelJobRequest& request,
                         loom::v1::Job* response);

  // From now on the wire calls go through loomctl's persistent connection
  // (client/persist_mux.h), kept for `idle` after the last call; a connection without a
  // WireClient is unchanged. When the persistent connection cannot be used, the calls are made
  // directly and `warnings` is told why, once.
  void UsePersistentConnection(absl::Duration idle, std::ostream* warnings);

  // Sets the deadline of a unary call on `context`, and its credentials.
  void PrepareUnary(grpc::ClientContext* context) const;
  // Sets the credentials of a streaming call (no deadline).
  void PrepareStream(grpc::ClientContext* context) const;

 private:
  void MakeChannel();
  // `path` on the wire when this connection has a WireClient, else `stub_method` of jobs().
  template <typename Request, typename Response>
  grpc::Status Unary(std::string_view path,
                     grpc::Status (loom::v1::JobService::StubInterface::*stub_method)(
                         grpc::ClientContext*, const Request&, Response*),
                     grpc::ClientContext* context, const Request& request, Response* response);

  std::string server_;
  absl::Duration rpc_timeout_;
  std::string token_;
  // Called once, by MakeChannel; null: plaintext.
  std::function<std::shared_ptr<grpc::ChannelCredentials>()> make_credentials_;
  std::once_flag channel_once_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::NodeService::Stub> nodes_;
  std::unique_ptr<loom::v1::ScalingService::Stub> scaling_;
  std::mutex wire_mu_;  // (not absl::Mutex: Debian's Abseil checks lock order on first use)
  // Null: every call on gRPC. Set by the constructor and never replaced; wire_mu_ serializes its
  // calls.
  std::unique_ptr<WireClient> wire_;
  std::optional<WireTls> wire_tls_;  // the WireClient's TLS files, for the persistent connection
  absl::Duration persist_idle_ = absl::ZeroDuration();  // zero: no persistent connection
  std::ostream* persist_warnings_ = nullptr;
  bool persist_warned_ = false;  // guarded by wire_mu_
};

}  // namespace loom::client
