// Authenticator: turns what a caller presented (a bearer token, a verified client certificate)
// into a Principal. Pure of gRPC: the adapters pass the strings in (rpc/call_auth.h), so every
// rule here is tested without a network.
//
// Modes:
//  - tokens and/or certificates (the secure setup): a call must present a token listed in the
//    tokens file, or a client certificate (verified by TLS against loomd's --tls-client-ca) whose
//    common name is `user:TENANT`, `admin:TENANT` or `node:NODE_ID`. Anything else is
//    UNAUTHENTICATED.
//  - open (no tokens file and no client CA; loomd allows it only with --insecure on loopback):
//    every caller is the admin of tenant "default".
//
// The tokens file is re-read when it changes (checked at most once per second), so tokens are
// added and revoked without a restart; a file that no longer parses keeps the last good table and
// logs why.
//
// Threading: thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/auth/principal.h"
#include "server/auth/token_table.h"

namespace loom::auth {

class Authenticator {
 public:
  // `tokens_file` may be empty (no tokens). `open` makes every caller admin of "default" and
  // requires no tokens file. `clock` must outlive the authenticator.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(std::string tokens_file, bool open,
                                                               const Clock* clock);

  // `authorization`: the call's "authorization" metadata ("Bearer TOKEN") or empty.
  // `cert_common_name`: the common name of the client certificate TLS verified, or empty.
  // UNAUTHENTICATED with a message saying what to present when neither proves anything.
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization,
                                         absl::string_view cert_common_name);

  bool open() const { return open_; }

 private:
  Authenticator(std::string tokens_file, bool open, const Clock* clock)
      : tokens_file_(std::move(tokens_file)), open_(open), clock_(clock) {}
  void MaybeReloadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string tokens_file_;
  const bool open_;
  const Clock* const clock_;
  absl::Mutex mu_;
  TokenTable table_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string file_version_ ABSL_GUARDED_BY(mu_);  // inode, size and mtime of the loaded file
};

// The principal a certificate common name stands for, or INVALID_ARGUMENT.
absl::StatusOr<Principal> PrincipalFromCommonName(absl::string_view common_name);

}  // namespace loom::auth
