#include "server/auth/token_table.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::auth {

std::optional<Role> RoleFromName(absl::string_view name) {
  if (name == "user") return Role::kUser;
  if (name == "admin") return Role::kAdmin;
  if (name == "node") return Role::kNode;
  return std::nullopt;
}

bool IsValidSubject(absl::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

namespace {

bool ValidToken(absl::string_view t) {
  if (t.size() < 16 || t.size() > 512) return false;
  for (char c : t) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        absl::string_view("._~+/=-").find(c) == absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

bool IsHexDigest(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
    case Role::kNode:
      return "node";
  }
  return "?";
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned char b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view origin) {
  TokenTable table;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> cols =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(origin, ":", line_no);
    if (cols.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected three columns `ROLE SUBJECT TOKEN` (got ", cols.size(), ")"));
    }
    Principal p;
    const std::optional<Role> role = RoleFromName(cols[0]);
    if (!role.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": role must be user, admin or node (got \"", cols[0].substr(0, 16), "\")"));
    }
    p.role = *role;
    if (!IsValidSubject(cols[1]) && !(p.role == Role::kNode && cols[1] == "*")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": subject must be a tenant or node id of [a-z0-9-], at most 63 characters",
          p.role == Role::kNode ? ", or * for any node" : ""));
    }
    p.subject = std::string(cols[1]);
    p.method = "token";
    std::string digest;
    if (absl::StartsWith(cols[2], "sha256:")) {
      digest = absl::AsciiStrToLower(cols[2].substr(7));
      if (!IsHexDigest(digest)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": sha256: must be followed by 64 hex digits"));
      }
    } else {
      if (!ValidToken(cols[2])) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         ": a token is 16 to 512 characters of [A-Za-z0-9._~+/=-]; make one with "
                         "`openssl rand -hex 32`"));
      }
      digest = Sha256Hex(cols[2]);
    }
    if (!table.by_digest_.emplace(digest, std::move(p)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": this token is already listed; every credential needs its own"));
    }
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tokens-file: cannot stat \"", path, "\": ", strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tokens-file: \"", path, "\" is readable or writable by group or others; chmod 600 it"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("--tokens-file: cannot read \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().size() > (1 << 20)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tokens-file: \"", path, "\" is over 1 MiB"));
  }
  return Parse(buffer.str(), path);
}

const Principal* TokenTable::Find(absl::string_view token) const {
  auto it = by_digest_.find(Sha256Hex(token));
  return it == by_digest_.end() ? nullptr : &it->second;
}

}  // namespace loom::auth
