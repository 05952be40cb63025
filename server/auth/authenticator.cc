#include "server/auth/authenticator.h"

#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace loom::auth {
namespace {

std::string FileVersion(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace

absl::StatusOr<Principal> PrincipalFromCommonName(absl::string_view cn) {
  const size_t colon = cn.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "a client certificate's common name must be user:TENANT, admin:TENANT or node:NODE_ID");
  }
  const std::optional<Role> role = RoleFromName(cn.substr(0, colon));
  const absl::string_view subject = cn.substr(colon + 1);
  if (!role.has_value() || !IsValidSubject(subject)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client certificate common name \"", cn.substr(0, 80),
                     "\": must be user:TENANT, admin:TENANT or node:NODE_ID with [a-z0-9-] names"));
  }
  return Principal{*role, std::string(subject), "certificate"};
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(std::string tokens_file,
                                                                     bool open,
                                                                     const Clock* clock) {
  if (open && !tokens_file.empty()) {
    return absl::InvalidArgumentError("open mode takes no tokens file");
  }
  std::unique_ptr<Authenticator> a(new Authenticator(std::move(tokens_file), open, clock));
  if (!a->tokens_file_.empty()) {
    absl::StatusOr<TokenTable> table = TokenTable::Load(a->tokens_file_);
    if (!table.ok()) return table.status();
    absl::MutexLock lock(&a->mu_);
    a->table_ = std::move(*table);
    a->file_version_ = FileVersion(a->tokens_file_);
    a->last_check_ = clock->Now();
  }
  return a;
}

void Authenticator::MaybeReloadLocked() {
  if (tokens_file_.empty()) return;
  const absl::Time now = clock_->Now();
  if (now - last_check_ < absl::Seconds(1)) return;
  last_check_ = now;
  const std::string version = FileVersion(tokens_file_);
  if (version == file_version_) return;
  absl::StatusOr<TokenTable> table = TokenTable::Load(tokens_file_);
  if (!table.ok()) {
    LOOM_LOG(ERROR) << "tokens file changed but cannot be used; keeping the previous tokens: "
                    << table.status();
    file_version_ = version;  // do not re-parse the same bad file every second
    return;
  }
  LOOM_LOG(INFO) << "tokens file reloaded: " << table->size() << " credential(s)";
  table_ = std::move(*table);
  file_version_ = version;
}

absl::StatusOr<Principal> Authenticator::Authenticate(absl::string_view authorization,
                                                      absl::string_view cert_common_name) {
  // Open mode: whatever a caller presents (a stray LOOM_TOKEN, say), it is the admin.
  if (open_) return Principal{Role::kAdmin, kDefaultTenant, "open"};
  if (!authorization.empty()) {
    if (!absl::StartsWithIgnoreCase(authorization, "bearer ")) {
      return absl::UnauthenticatedError(
          "the authorization metadata must be `Bearer TOKEN` (loomctl: --token or LOOM_TOKEN)");
    }
    const absl::string_view token = authorization.substr(7);
    absl::MutexLock lock(&mu_);
    MaybeReloadLocked();
    if (const Principal* p = table_.Find(token); p != nullptr) return *p;
    return absl::UnauthenticatedError(
        "unknown or revoked token; ask the operator for one listed in loomd's --tokens-file");
  }
  if (!cert_common_name.empty()) {
    absl::StatusOr<Principal> p = PrincipalFromCommonName(cert_common_name);
    if (!p.ok()) return absl::UnauthenticatedError(p.status().message());
    return p;
  }
  return absl::UnauthenticatedError(
      "no credentials: send a token (loomctl --token or LOOM_TOKEN; loom-worker "
      "--join-token-file) or a client certificate signed by loomd's --tls-client-ca");
}

}  // namespace loom::auth
