// A persistent connection for loomctl's unary calls (--persist=DURATION or $LOOM_PERSIST), as
// ssh's ControlPersist: the first call starts a background loomctl (the mux) that keeps its
// connections to loomd open, and later calls hand it their request over a Unix socket instead of
// opening a TCP connection, an HTTP/2 session and, with TLS, a handshake each. The mux ends after
// DURATION without a call.
//
// Automatic over TLS: a loomctl given no --persist and no $LOOM_PERSIST (0 turns it off) that
// talks TLS makes its first call directly, and leaves a mark (an empty file beside the mux's
// socket). A call that finds a mark less than kAutoPersistWindow old starts the mux, which
// ends kAutoPersistIdle after the last call. So a single call never leaves a process behind, and
// a script's loop of calls pays the handshake about twice (its first call's and the mux's); a
// running mux, started either way, takes the calls of both.
//
// Why: a script that calls loomctl in a loop pays per call for what one process could pay once.
// On the 2-core machine of docs/benchmarks.md, loomd spends 1.23 ms of CPU per CreateJob that
// comes on a connection of its own and 0.53 ms per CreateJob on a connection already open; over
// TLS a loomctl spends 1.8-2.3 ms of CPU in OpenSSL 3.0's start (OPENSSL_init_ssl, SSL_CTX_new)
// and about 1.8 ms more in the handshake, and loomd 1.1-1.4 ms per handshake (2026-12-07 night).
//
// What goes through it: CreateJob, GetJob, ListJobs and CancelJob on the wire (wire_client.h).
// Streams (watch, logs) and the other calls do not.
//
// Security:
//  - The socket lives in a directory only the user can enter: $XDG_RUNTIME_DIR/loom, else
//    /tmp/loom-UID, created with mode 0700 and checked before every use (a directory, not a
//    link, owned by the user, no access for group or others). Anything else is refused.
//  - The mux serves only peers of its own user id (SO_PEERCRED).
//  - It holds no bearer token: each call brings its own, and the mux starts with none of the
//    caller's environment but OpenSSL's variables (OPENSSL_*, SSL_CERT_*). It holds the TLS
//    files it was started with, which the user can read anyway.
//  - A call names the mux's key: the server, the TLS files with their device, inode, size and
//    modification time, and loomctl's own executable likewise. A mux with another key refuses
//    the call, so a changed server, a rotated certificate or a new loomctl gets a mux of its own.
//
// Failures never cost a call that would have worked without --persist: when no mux can take it
// (no private directory, the mux does not start, it refuses, it ends before answering) the call
// is made directly. One exception: a CancelJob whose mux ended after taking the request is not
// repeated (a second cancel of a cancelled job fails), and says so. loomd's answers, errors
// included, are relayed as they are.
//
// Threading: the client side is a plain function; the mux serves each call on a thread of its
// own (started on demand, at most 64, kept until it ends).
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/wire_client.h"

namespace loom::client {

// What a mux connects to, and how long it outlives its last call.
struct PersistTarget {
  std::string server;          // HOST:PORT
  std::optional<WireTls> tls;  // TLS against tls->ca, else plaintext
  absl::Duration idle;         // > 0
  // Automatic (see above): start a mux only for a call that follows another within
  // kAutoPersistWindow; say nothing when none can be used.
  bool automatic = false;
};

// Why these: a loop calls again within milliseconds, a person typing hardly within two
// seconds; a mux that waits ten seconds outlives the pauses of a loop that does other work.
inline constexpr absl::Duration kAutoPersistWindow = absl::Seconds(2);
inline constexpr absl::Duration kAutoPersistIdle = absl::Seconds(10);

// Whether a mux relays calls to `path`: CreateJob, GetJob, ListJobs and CancelJob of JobService,
// nothing else (a mux is not a general relay to loomd, whoever of its user writes to it).
bool MuxRelays(std::string_view path);

// The private directory of the user's mux sockets, created when missing; an error that names
// the directory and what is wrong with it.
absl::StatusOr<std::string> PersistDirectory();

// The identity of the mux that serves `target` (see above); an error when a TLS file cannot be
// examined (the direct call then reports it).
absl::StatusOr<std::string> PersistKey(const PersistTarget& target);

// The unary call `path` with the serialized `request` and `token` (empty: none) through the mux
// for `target`, started when none answers. Returns nullopt when no mux took the call (the caller
// calls directly; `*note` then says why when it is worth telling the user, else stays empty), or
// loomd's answer: its status, and when OK the serialized answer in `*response`. `retry_safe`:
// whether the call may be made again directly when the mux ends after taking it.
std::optional<grpc::Status> CallThroughMux(const PersistTarget& target, std::string_view path,
                                           std::string_view request, std::string_view token,
                                           absl::Time deadline, bool retry_safe,
                                           std::string* response, std::string* note);

// The mux's main: `loomctl --persist-mux SOCKET KEY SERVER IDLE_MS READY_FD [CA CERT KEY_FILE]`,
// as CallThroughMux starts it (detached, in a session of its own, its stdio on /dev/null; a byte
// on READY_FD once it listens). Serves
// until it has been idle for IDLE_MS, then ends the process (exit code 0); returns an exit code
// only when it cannot serve.
int RunPersistMux(int argc, char** argv);

// ---- The frames on the mux's socket (exposed for tests) ---------------------------------------

struct MuxRequest {
  std::string key;
  std::string path;
  std::string token;
  int64_t deadline_unix_ms = 0;
  std::string body;  // the serialized request message
};

struct MuxAnswer {
  int32_t code = 0;  // a grpc::StatusCode, or kMuxRefused
  std::string message;
  std::string body;  // the serialized answer message, when code is OK
};

// The answer of a mux that does not take a call (another key, or closing): call directly.
inline constexpr int32_t kMuxRefused = 1000;

// Bounds on what a frame may carry; a frame beyond them is refused whole.
inline constexpr size_t kMuxMaxKeyBytes = 16 << 10;
inline constexpr size_t kMuxMaxPathBytes = 256;
inline constexpr size_t kMuxMaxTokenBytes = 16 << 10;
inline constexpr size_t kMuxMaxRequestBodyBytes = 4 << 20;  // loomd's own receive limit
inline constexpr size_t kMuxMaxMessageBytes = 64 << 10;

// A frame is a 4-byte tag, a 4-byte little-endian payload length, then the payload.
std::string EncodeMuxRequest(const MuxRequest& request);
std::string EncodeMuxAnswer(const MuxAnswer& answer);
// From a whole frame (tag and length included). Errors name what is wrong; never crash.
absl::StatusOr<MuxRequest> DecodeMuxRequest(std::string_view frame);
absl::StatusOr<MuxAnswer> DecodeMuxAnswer(std::string_view frame);

}  // namespace loom::client
