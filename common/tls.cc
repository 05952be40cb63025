#include "common/tls.h"

#include <arpa/inet.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace loom {
namespace {

// A file the process can read and that looks like PEM; named by its flag in the error.
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

absl::Status CheckPair(const TlsFiles& files, absl::string_view prefix) {
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

}  // namespace

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr addr{};
  const std::string h(host);
  if (inet_pton(AF_INET, h.c_str(), &addr) == 1) {
    return (ntohl(addr.s_addr) >> 24) == 127;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, bool insecure, absl::string_view listen, absl::string_view flag_prefix) {
  absl::StatusOr<HostPort> hp = ParseHostPort(std::string(listen));
  if (!hp.ok()) return hp.status();
  if (absl::Status s = CheckPair(files, flag_prefix); !s.ok()) return s;
  if (files.cert.empty()) {
    if (!files.ca.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(flag_prefix, "-client-ca needs ", flag_prefix,
                                                     "-cert and ", flag_prefix, "-key"));
    }
    if (!insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no TLS: give ", flag_prefix, "-cert and ", flag_prefix,
          "-key (scripts/dev-certs.sh makes a development CA and certificates), or --insecure "
          "for plaintext on a loopback address"));
    }
    if (!IsLoopbackHost(hp->host)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--insecure is for loopback development only, and ", listen,
                       " is not a loopback address: give ", flag_prefix, "-cert and ", flag_prefix,
                       "-key (scripts/dev-certs.sh makes a development CA and certificates)"));
    }
    return grpc::InsecureServerCredentials();
  }
  if (insecure) {
    return absl::InvalidArgumentError(
        absl::StrCat("--insecure contradicts ", flag_prefix, "-cert: give one or the other"));
  }
  if (!files.ca.empty()) {
    if (absl::Status s = CheckPemFile(files.ca, absl::StrCat(flag_prefix, "-client-ca")); !s.ok()) {
      return s;
    }
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, kTlsRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.ca.empty()) {
    options.watch_root_certs();
    // Requested, verified when sent, but not required: users and ranks authenticate with
    // tokens and secrets; the services that need a certificate check the peer themselves.
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<bool> ChannelIsPlaintext(const TlsFiles& files, bool insecure,
                                        absl::string_view target, absl::string_view flag_prefix) {
  absl::StatusOr<HostPort> hp = ParseHostPort(std::string(target));
  if (!hp.ok()) return hp.status();
  if (absl::Status s = CheckPair(files, flag_prefix); !s.ok()) return s;
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

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files, bool insecure, absl::string_view target, absl::string_view flag_prefix) {
  absl::StatusOr<bool> plaintext = ChannelIsPlaintext(files, insecure, target, flag_prefix);
  if (!plaintext.ok()) return plaintext.status();
  if (*plaintext) return grpc::InsecureChannelCredentials();
  if (!files.enabled()) return grpc::SslCredentials(grpc::SslCredentialsOptions());
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (!files.ca.empty() || !files.cert.empty()) {
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.key, files.cert, files.ca, kTlsRefreshSeconds);
    options.set_certificate_provider(provider);
    if (!files.ca.empty()) options.watch_root_certs();
    if (!files.cert.empty()) options.watch_identity_key_cert_pairs();
  }
  return grpc::experimental::TlsCredentials(options);
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
