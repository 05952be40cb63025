// The TLS files and plaintext rule shared by every client and server of Loom, without gRPC:
// which PEM files were given and whether they are usable, whether a client's channel is
// plaintext, and bearer token files. loomctl uses only these (it does not link gRPC's runtime,
// client/wire_client.h); common/tls.h makes gRPC credentials from the same files.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

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

// A file the process can read and that looks like PEM; FAILED_PRECONDITION naming `flag`
// otherwise.
absl::Status CheckPemFile(const std::string& path, absl::string_view flag);

// cert and key both or neither, each a readable PEM file; errors name PREFIX-cert/PREFIX-key.
absl::Status CheckTlsPair(const TlsFiles& files, absl::string_view prefix);

// Whether a client of `target` (HOST:PORT) talks plaintext (true) or TLS (false), with the checks
// and errors of common/tls.h's MakeChannelCredentials (the CA file is read). With `files.ca`: TLS
// verifying the server against it (and presenting cert/key when given). With only cert/key: TLS
// against the system's roots. Without files: plaintext when `insecure` or the target is loopback
// (the local development default), else TLS against the system's roots.
absl::StatusOr<bool> ChannelIsPlaintext(const TlsFiles& files, bool insecure,
                                        absl::string_view target, absl::string_view flag_prefix);

// Reads a bearer token from `path` (named by `flag` in errors): one line, surrounding whitespace
// dropped; FAILED_PRECONDITION when the file is readable by group or others (chmod 600) or empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag);

}  // namespace loom
