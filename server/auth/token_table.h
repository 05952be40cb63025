// TokenTable: the bearer tokens loomd accepts, parsed from the operator's tokens file.
//
// File format, one credential per line, blank lines and '#' comments ignored:
//
//   # role   subject      token
//   user     team-a       7f1c...            (a tenant's user; subject = tenant)
//   admin    ops          sha256:9b2e...     (the token's SHA-256 in hex instead of the token)
//   node     *            4d0a...            (a join token for any node id)
//   node     gpu-node-7   a81f...            (a token for that node id only)
//
// Tokens are at least 16 characters of [A-Za-z0-9._~+/=-]; subjects are [a-z0-9-], at most 63
// characters (node subjects may be "*"). Only SHA-256 digests are kept in memory. The file must not
// be readable by group or others (like ssh keys); a token listed twice is an error.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth/principal.h"

namespace loom::auth {

class TokenTable {
 public:
  // Parses the text of a tokens file; `origin` names the file in errors, which give the line
  // number and never the token.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view origin);
  // Reads and parses `path`; FAILED_PRECONDITION when it is readable by group or others.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The principal for a presented token, or nullptr.
  const Principal* Find(absl::string_view token) const;
  size_t size() const { return by_digest_.size(); }

 private:
  std::map<std::string, Principal> by_digest_;  // hex SHA-256 -> principal
};

// The role named `name` ("user", "admin", "node"), or nullopt.
std::optional<Role> RoleFromName(absl::string_view name);
// A tenant or node id: 1..63 characters of [a-z0-9-].
bool IsValidSubject(absl::string_view subject);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

}  // namespace loom::auth
