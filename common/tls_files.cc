#include "common/tls_files.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace loom {

absl::Status CheckPemFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": cannot read \"", path, "\"; give a readable PEM file"));
  }
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (!absl::StrContains(head, "-----BEGIN ")) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": \"", path, "\" is not a PEM file (no -----BEGIN line)"));
  }
  return absl::OkStatus();
}

absl::Status CheckTlsPair(const TlsFiles& files, absl::string_view prefix) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "-cert and ", prefix, "-key go together: give both or neither"));
  }
  if (!files.cert.empty()) {
    if (absl::Status s = CheckPemFile(files.cert, absl::StrCat(prefix, "-cert")); !s.ok()) return s;
    if (absl::Status s = CheckPemFile(files.key, absl::StrCat(prefix, "-key")); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr addr{};
  const std::string h(host);
  if (inet_pton(AF_INET, h.c_str(), &addr) == 1) {
    return (ntohl(addr.s_addr) >> 24) == 127;
  }
  return false;
}

absl::StatusOr<bool> ChannelIsPlaintext(const TlsFiles& files, bool insecure,
                                        absl::string_view target, absl::string_view flag_prefix) {
  absl::StatusOr<HostPort> hp = ParseHostPort(std::string(target));
  if (!hp.ok()) return hp.status();
  if (absl::Status s = CheckTlsPair(files, flag_prefix); !s.ok()) return s;
  if (!files.enabled()) return insecure || IsLoopbackHost(hp->host);
  if (insecure) {
    return absl::InvalidArgumentError(
        absl::StrCat("--insecure contradicts ", flag_prefix, "-ca/-cert: give one or the other"));
  }
  if (!files.ca.empty()) {
    if (absl::Status s = CheckPemFile(files.ca, absl::StrCat(flag_prefix, "-ca")); !s.ok()) {
      return s;
    }
  }
  return false;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(flag, ": cannot stat \"", path, "\""));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, ": \"", path, "\" is readable or writable by group or others; chmod 600 it"));
  }
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  token = std::string(absl::StripAsciiWhitespace(token));
  if (!in && token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(flag, ": cannot read \"", path, "\""));
  }
  if (token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(flag, ": \"", path, "\" holds no token"));
  }
  return token;
}

}  // namespace loom
