// Transport security for every gRPC server and client of Loom: TLS from PEM files that are
// re-read while the process runs (certificate rotation without a restart), mutual TLS where a
// client presents a certificate, and the one rule about plaintext: it is allowed only on loopback,
// and only when asked for with --insecure.
//
// The files are watched by gRPC's FileWatcherCertificateProvider (re-read every
// kTlsRefreshSeconds); rotate them atomically (write elsewhere, then rename) so a reload never sees
// a key without its certificate.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

inline constexpr unsigned kTlsRefreshSeconds = 2;

// PEM files. `cert` and `key` go together (both or neither); `ca` is the bundle that verifies the
// peer: a server's clients (mutual TLS), a client's server.
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(absl::string_view host);

// Credentials for a server listening on `listen` (HOST:PORT). `flag_prefix` names the flags in
// errors (e.g. "--tls" for --tls-cert/--tls-key/--tls-client-ca). With cert and key: TLS; with
// `files.ca` as well, client certificates are requested and, when sent, verified against it
// (callers that need one check the peer identity themselves: tokens remain possible). Without
// TLS files: plaintext, but only when `insecure` and the host is loopback; otherwise
// FAILED_PRECONDITION saying how to configure TLS.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, bool insecure, absl::string_view listen, absl::string_view flag_prefix);

// Whether MakeChannelCredentials(files, insecure, target, flag_prefix) makes plaintext
// credentials (true) or TLS ones (false), with the same checks and errors (the CA file is read),
// and without making any: creating gRPC credentials starts gRPC's runtime, which loomctl's wire
// calls avoid.
absl::StatusOr<bool> ChannelIsPlaintext(const TlsFiles& files, bool insecure,
                                        absl::string_view target, absl::string_view flag_prefix);

// Credentials for a client of `target` (HOST:PORT). With `files.ca`: TLS verifying the server
// against it (and presenting cert/key when given: mutual TLS). With only cert/key: TLS against
// the system's roots. Without files: plaintext when `insecure` or the target is loopback (the
// local development default), else TLS against the system's roots.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files, bool insecure, absl::string_view target, absl::string_view flag_prefix);

// Reads a bearer token from `path` (named by `flag` in errors): one line, surrounding whitespace
// dropped; FAILED_PRECONDITION when the file is readable by group or others (chmod 600) or empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag);

}  // namespace loom
