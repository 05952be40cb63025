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
#include "common/tls_files.h"

namespace loom {

inline constexpr unsigned kTlsRefreshSeconds = 2;

// Credentials for a server listening on `listen` (HOST:PORT). `flag_prefix` names the flags in
// errors (e.g. "--tls" for --tls-cert/--tls-key/--tls-client-ca). With cert and key: TLS; with
// `files.ca` as well, client certificates are requested and, when sent, verified against it
// (callers that need one check the peer identity themselves: tokens remain possible). Without
// TLS files: plaintext, but only when `insecure` and the host is loopback; otherwise
// FAILED_PRECONDITION saying how to configure TLS.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, bool insecure, absl::string_view listen, absl::string_view flag_prefix);

// Credentials for a client of `target` (HOST:PORT). With `files.ca`: TLS verifying the server
// against it (and presenting cert/key when given: mutual TLS). With only cert/key: TLS against
// the system's roots. Without files: plaintext when `insecure` or the target is loopback (the
// local development default), else TLS against the system's roots.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files, bool insecure, absl::string_view target, absl::string_view flag_prefix);

}  // namespace loom
