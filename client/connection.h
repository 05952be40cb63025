// How loomctl reaches loomd: the address, TLS and the bearer token, in one place so that every
// command gets them.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/rpc_paths.h"
#include "client/wire_client.h"
#include "google/protobuf/message_lite.h"

namespace loom::client {

inline constexpr char kDefaultServer[] = "127.0.0.1:7070";

// The server address: `flag` when given, else $LOOM_SERVER when set and not empty, else
// kDefaultServer.
std::string ResolveServerAddress(const std::string& flag);

// The bearer token: `flag` when given, else the first line of the file `file_flag` (or
// $LOOM_TOKEN_FILE), else $LOOM_TOKEN; empty when none is set.
absl::StatusOr<std::string> ResolveToken(const std::string& flag, const std::string& file_flag);

// A connection to one loomd. Every call goes on the wire (client/wire_client.h): loomctl does
// not link gRPC's runtime. Unary calls carry `rpc_timeout` as their deadline and fail fast
// (UNAVAILABLE) when the server cannot be reached; streams have no deadline.
//
// Thread-safe: calls from several threads at once each get a WireClient (and so a connection)
// of their own, taken from a pool of idle ones and put back after the call, so a sweep's
// concurrent creates overlap as they did on one gRPC channel; through the persistent connection
// (UsePersistentConnection), each is a call of its own to the mux.
class Connection {
 public:
  // Plaintext (loopback, or --insecure), with `token` sent as "authorization: Bearer TOKEN"
  // when not empty.
  Connection(std::string server, absl::Duration rpc_timeout, std::string token = "");
  // TLS, verifying the server with `tls` (WireTls: an empty CA means the system's roots).
  Connection(std::string server, absl::Duration rpc_timeout, std::string token, WireTls tls);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& server() const { return server_; }

  // The unary call `path` (rpc::k...), deadline rpc_timeout from now. `response` is written only
  // when the status is OK.
  absl::Status Call(std::string_view path, const google::protobuf::MessageLite& request,
                    google::protobuf::MessageLite* response);

  // The server stream `path` without a deadline: `on_message` gets each message as it comes
  // (serialized) and returns false to end the call early, which then returns OK. Otherwise
  // returns the stream's final status (OK when the server ended it well).
  absl::Status Stream(std::string_view path, const google::protobuf::MessageLite& request,
                      absl::FunctionRef<bool(std::string_view)> on_message);

  // From now on the unary calls the mux relays (client/persist_mux.h: MuxRelays) go through
  // loomctl's persistent connection, kept for `idle` after the last call. When the persistent
  // connection cannot be used, the calls are made directly and `warnings` (may be null) is told
  // why, once. `automatic`: started only for a call that follows another closely (see
  // persist_mux.h), and nothing said when it cannot be used.
  void UsePersistentConnection(absl::Duration idle, std::ostream* warnings, bool automatic = false);

 private:
  // An idle WireClient, or a new one; Release puts it back for the next call.
  std::unique_ptr<WireClient> Acquire();
  void Release(std::unique_ptr<WireClient> client);

  const std::string server_;
  const absl::Duration rpc_timeout_;
  const std::string token_;
  const std::optional<WireTls> tls_;  // nullopt: plaintext

  std::mutex pool_mu_;  // (not absl::Mutex: Debian's Abseil checks lock order on first use)
  std::vector<std::unique_ptr<WireClient>> idle_;  // guarded by pool_mu_

  std::mutex persist_mu_;                               // guards the four below
  absl::Duration persist_idle_ = absl::ZeroDuration();  // zero: no persistent connection
  std::ostream* persist_warnings_ = nullptr;
  bool persist_warned_ = false;
  bool persist_automatic_ = false;
};

// Parses a serialized message from a stream into `out`; false when it is not one.
bool ParseStreamMessage(std::string_view bytes, google::protobuf::MessageLite* out);

}  // namespace loom::client
