#include "server/auth/rendezvous_secrets.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::auth {
namespace {

constexpr size_t kKeyBytes = 32;

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " \"", path, "\": ", std::strerror(errno)));
}

absl::StatusOr<std::string> ReadKey(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open the rendezvous key", path);
  struct stat st {};
  if (fstat(fd, &st) != 0 || (st.st_mode & 077) != 0 || st.st_size != kKeyBytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "the rendezvous key \"", path, "\" must be ", kKeyBytes,
        " bytes and readable by loomd's user only; remove it to make a new one (running gangs "
        "then fail their next rendezvous and restart)"));
  }
  std::string key(kKeyBytes, '\0');
  const ssize_t n = read(fd, key.data(), key.size());
  close(fd);
  if (n != static_cast<ssize_t>(kKeyBytes))
    return ErrnoError("cannot read the rendezvous key", path);
  return key;
}

absl::StatusOr<std::string> CreateKey(const std::string& path) {
  std::string key(kKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), kKeyBytes) != 1) {
    return absl::InternalError("no randomness for the rendezvous key (RAND_bytes failed)");
  }
  const std::string tmp = path + ".tmp";
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create the rendezvous key", tmp);
  const bool ok =
      write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()) && fsync(fd) == 0;
  close(fd);
  if (!ok) return ErrnoError("cannot write the rendezvous key", tmp);
  // link() fails if another loomd created the key meanwhile: then use theirs.
  if (link(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    unlink(tmp.c_str());
    if (saved == EEXIST) return ReadKey(path);
    errno = saved;
    return ErrnoError("cannot install the rendezvous key", path);
  }
  unlink(tmp.c_str());
  return key;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RendezvousSecrets>> RendezvousSecrets::Open(
    const std::string& key_path) {
  absl::StatusOr<std::string> key =
      access(key_path.c_str(), F_OK) == 0 ? ReadKey(key_path) : CreateKey(key_path);
  if (!key.ok()) return key.status();
  return std::unique_ptr<RendezvousSecrets>(new RendezvousSecrets(std::move(*key)));
}

std::unique_ptr<RendezvousSecrets> RendezvousSecrets::ForKey(std::string key) {
  return std::unique_ptr<RendezvousSecrets>(new RendezvousSecrets(std::move(key)));
}

RendezvousSecrets::RendezvousSecrets(std::string key) : key_(std::move(key)) {
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac == nullptr) return;
  keyed_ = EVP_MAC_CTX_new(hmac);
  EVP_MAC_free(hmac);  // the context holds its own reference
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_END};
  if (keyed_ != nullptr && EVP_MAC_init(keyed_, reinterpret_cast<const unsigned char*>(key_.data()),
                                        key_.size(), params) != 1) {
    EVP_MAC_CTX_free(keyed_);
    keyed_ = nullptr;
  }
}

RendezvousSecrets::~RendezvousSecrets() { EVP_MAC_CTX_free(keyed_); }

std::string RendezvousSecrets::SecretFor(absl::string_view job, int64_t generation) const {
  const std::string message = absl::StrCat(job, "|", generation);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // The keyed state is only read here (copied), never updated, so threads may share it.
  EVP_MAC_CTX* ctx = keyed_ != nullptr ? EVP_MAC_CTX_dup(keyed_) : nullptr;
  size_t written = 0;
  if (ctx != nullptr &&
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(message.data()), message.size()) ==
          1 &&
      EVP_MAC_final(ctx, mac, &written, sizeof(mac)) == 1) {
    len = static_cast<unsigned int>(written);
  } else {
    HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
         reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  }
  EVP_MAC_CTX_free(ctx);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[mac[i] >> 4]);
    out.push_back(kHex[mac[i] & 15]);
  }
  return out;
}

bool RendezvousSecrets::Check(absl::string_view job, int64_t generation,
                              absl::string_view presented) const {
  const std::string expected = SecretFor(job, generation);
  // Empty only if OpenSSL failed: then nothing matches, not even an empty presented secret.
  return !expected.empty() && presented.size() == expected.size() &&
         CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

}  // namespace loom::auth
