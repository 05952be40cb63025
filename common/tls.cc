#include "common/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace loom {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, bool insecure, absl::string_view listen, absl::string_view flag_prefix) {
  absl::StatusOr<HostPort> hp = ParseHostPort(std::string(listen));
  if (!hp.ok()) return hp.status();
  if (absl::Status s = CheckTlsPair(files, flag_prefix); !s.ok()) return s;
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

}  // namespace loom
