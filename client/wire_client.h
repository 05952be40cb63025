// gRPC calls spoken on the wire (HTTP/2 through libnghttp2, messages through protobuf), without
// gRPC's runtime: unary calls and server streams, plaintext or TLS. Why: a loomctl process lives
// for one call, and on a small machine gRPC's runtime start and its channel cost more CPU than
// everything else the call does (about 1.4 ms of a 3.2 ms submit, docs/benchmarks.md): its
// threads, its pollers and its resolver exist to serve many calls over a long life. Even linked
// and never started, gRPC's static initializers and the pages they touch cost every loomctl
// process about 0.1 ms of CPU and 26 page faults (docs/benchmarks.md, 2026-12-07 evening), so
// loomctl makes every call here and does not link gRPC's runtime at all.
//
// What it speaks (the gRPC-over-HTTP/2 protocol, as loomd's gRPC server expects it): a POST to
// /package.Service/Method with content-type application/grpc, "te: trailers", the deadline as
// grpc-timeout and the bearer token as authorization; one length-prefixed, uncompressed request
// message; the answer's grpc-status and grpc-message from its trailers (or its headers, for a
// trailers-only answer). Plaintext, or TLS through OpenSSL (WireTls: the server verified against
// a CA file, or the system's trusted certificates when none is given, and by its name; a client
// certificate for mutual TLS when given; ALPN "h2"). A server stream's messages are handed to
// the caller one by one as they arrive.
//
// Threading: none of its own. One call at a time per WireClient; the connection stays open
// between calls and is opened again after any transport error, or before a call when the server
// ended it meanwhile (a GOAWAY or EOF found waiting). Between calls nobody reads it, so a PING is
// answered only with the next call, and a gRPC server's graceful shutdown waits (20 s) for an idle
// connection that is still open: hold a WireClient for as long as it is used, not longer (the
// persistent connection of client/persist_mux.h closes its idle connections itself).
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"

namespace loom::client {

// Answers larger than this are refused, as by loomctl's gRPC channel (SetMaxReceiveMessageSize).
inline constexpr size_t kWireMaxResponseBytes = 64 << 20;

// TLS for a WireClient: PEM files, as loomctl's --tls-ca, --tls-cert and --tls-key.
struct WireTls {
  std::string ca;    // verifies the server; empty: the system's trusted certificates
  std::string cert;  // with key: presented to the server (mutual TLS)
  std::string key;
};

class WireClient {
 public:
  // `server` is HOST:PORT (an IP literal, or a name looked up with getaddrinfo); `token`, when
  // not empty, goes with every call as "authorization: Bearer TOKEN".
  // With `tls`, the connection is TLS, else plaintext.
  WireClient(std::string server, std::string token, std::optional<WireTls> tls = std::nullopt);
  // Over `connected_fd`, a stream socket already connected to the server, which it takes over
  // (closes); `server` (HOST:PORT) names it in the :authority header, for TLS and in errors.
  // For tests and the fuzz target, which play the server on the other end of a socketpair.
  // After a transport error the client has no way back to the server: later calls fail with
  // UNAVAILABLE.
  WireClient(int connected_fd, std::string server, std::string token,
             std::optional<WireTls> tls = std::nullopt);
  ~WireClient();
  WireClient(const WireClient&) = delete;
  WireClient& operator=(const WireClient&) = delete;

  // Calls `path` ("/loom.v1.JobService/GetJob") with `request` and parses the answer into
  // `response`; gives up at `deadline`. Returns the server's status, or a transport failure:
  // UNAVAILABLE when the server cannot be reached, its certificate does not verify, or the
  // connection breaks before the answer; FAILED_PRECONDITION when the TLS files cannot be used;
  // DEADLINE_EXCEEDED at the deadline, INTERNAL or UNKNOWN when the answer is not gRPC (another
  // kind of server), RESOURCE_EXHAUSTED when it is larger than kWireMaxResponseBytes,
  // INVALID_ARGUMENT when the token cannot be sent in a header. Never crashes on what the peer
  // sends. `response` is only written when the status is OK.
  grpc::Status Call(std::string_view path, const google::protobuf::MessageLite& request,
                    google::protobuf::MessageLite* response, absl::Time deadline);
  // Call with the request and the answer as serialized messages, and `token` (empty: none)
  // instead of the client's own, for a caller that only relays them (client/persist_mux.h).
  // `response` is only written when the status is OK.
  grpc::Status CallSerialized(std::string_view path, std::string_view request,
                              std::string* response, absl::Time deadline, std::string_view token);
  // A server-streaming call: `on_message` gets each answer message (serialized, without gRPC's
  // prefix) as it arrives, and returns false to want no more, which cancels the call (as gRPC's
  // TryCancel) and returns OK. Otherwise returns the server's status when it ends the stream, or
  // a transport failure as Call does (a message larger than kWireMaxResponseBytes is
  // RESOURCE_EXHAUSTED). `deadline` may be absl::InfiniteFuture(): no grpc-timeout is sent and
  // the call waits as long as the server keeps it open.
  grpc::Status CallStream(std::string_view path, const google::protobuf::MessageLite& request,
                          absl::FunctionRef<bool(std::string_view)> on_message,
                          absl::Time deadline);

  // Takes what the server sent to the open session since the last call (a PING, TLS session
  // tickets) and closes the session when the server has ended it (GOAWAY, EOF), so that a
  // connection that outlived a loomd restart is opened again instead of failing a call. Every
  // call does this first; a holder of an idle client may do it when session_fd() is readable.
  void DropSessionIfClosed();
  // The open session's socket, or -1 when none is open.
  int session_fd() const;

 private:
  struct Session;  // the socket and the nghttp2 session, open between calls

  grpc::Status Connect(absl::Time deadline);
  // The call itself: `framed_request` is the request message after gRPC's 5-byte prefix; on OK
  // `*framed_answer` is the answer's body, checked to be exactly one uncompressed message after
  // its prefix. Call and CallSerialized differ only in how they make and read those. With
  // `on_message`, a server stream: the messages go there instead (CallStream).
  grpc::Status Exchange(std::string_view path, std::string framed_request, absl::Time deadline,
                        std::string_view token, std::string* framed_answer,
                        absl::FunctionRef<bool(std::string_view)>* on_message = nullptr);
  // Over the connected `fd` (taken over): TLS with `host` as the name to verify, when tls_ is
  // set, then HTTP/2's settings.
  grpc::Status StartSession(int fd, const std::string& host, absl::Time deadline);

  std::string server_;
  std::string token_;
  std::optional<WireTls> tls_;
  std::unique_ptr<Session> session_;
  int adopted_fd_ = -1;  // the connected_fd not yet used by a session; -2 once used
};

// gRPC's grpc-timeout header value for `remaining` (at most 8 digits and a unit; at least 1 ms).
std::string GrpcTimeoutHeader(absl::Duration remaining);

// grpc-message is percent-encoded on the wire; this undoes it (a '%' not followed by two hex
// digits stays as it is).
std::string PercentDecode(std::string_view s);

}  // namespace loom::client
