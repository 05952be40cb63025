// RendezvousSecrets: the per-(job, generation) secrets that let a gang's ranks, and only them,
// read and write that gang's rendezvous keys.
//
// A secret is HMAC-SHA256(key, "jobs/ID|GENERATION") in hex, where `key` is 32 random bytes kept
// in the state directory (rendezvous.key, mode 0600, created on first start). Deriving instead
// of storing means a restarted loomd recognises the secrets of gangs that kept running, and a
// new generation gets a new secret without any write. The secret travels in the Assignment to
// the worker, which hands it to the ranks in their environment.
//
// Threading: immutable after Open(); thread-safe (each call works on its own copy of the keyed
// HMAC state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

typedef struct evp_mac_ctx_st EVP_MAC_CTX;  // <openssl/types.h>

namespace loom::auth {

class RendezvousSecrets {
 public:
  // Reads `key_path`, or creates it with 32 random bytes when it does not exist.
  // FAILED_PRECONDITION when it exists with the wrong size or is readable by others.
  static absl::StatusOr<std::unique_ptr<RendezvousSecrets>> Open(const std::string& key_path);
  // For tests: a fixed key.
  static std::unique_ptr<RendezvousSecrets> ForKey(std::string key);

  ~RendezvousSecrets();
  RendezvousSecrets(const RendezvousSecrets&) = delete;
  RendezvousSecrets& operator=(const RendezvousSecrets&) = delete;

  std::string SecretFor(absl::string_view job, int64_t generation) const;
  // Constant-time comparison of `presented` with SecretFor(job, generation).
  bool Check(absl::string_view job, int64_t generation, absl::string_view presented) const;

 private:
  explicit RendezvousSecrets(std::string key);
  const std::string key_;
  // HMAC-SHA256 already keyed with key_, copied for each secret: OpenSSL 3's one-shot HMAC()
  // looks up the HMAC and SHA-256 implementations on every call, which perf found costing tens
  // of microseconds per gang placement in loomd (cold, between the placement's sync and the
  // assignment). Null when OpenSSL could not make it; then HMAC() is used.
  EVP_MAC_CTX* keyed_ = nullptr;
};

}  // namespace loom::auth
