#include "common/spec_path.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/echo.h"

namespace loom {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

}  // namespace

absl::StatusOr<std::string> NormalizeSpecPath(absl::string_view path, absl::string_view field) {
  if (path.find('\0') != absl::string_view::npos) {
    return Invalid(field, absl::StrCat(Echo(path), " contains a NUL byte"));
  }
  if (path.size() > kMaxSpecPathBytes) {
    return Invalid(field, absl::StrCat(Echo(path), " is longer than ", kMaxSpecPathBytes,
                                       " bytes; use a shorter path"));
  }
  if (path.empty() || path.front() != '/') {
    return Invalid(field, absl::StrCat(Echo(path),
                                       " is relative; give an absolute path (loomctl makes "
                                       "relative paths absolute)"));
  }
  std::string out;
  for (const absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      return Invalid(field, absl::StrCat(Echo(path), " contains \"..\"; give the path without it"));
    }
    absl::StrAppend(&out, "/", part);
  }
  if (out.empty()) return std::string(1, '/');
  return out;
}

bool IsUnderRoot(absl::string_view path, absl::string_view root) {
  if (root == "/") return !path.empty() && path.front() == '/';
  if (path.size() < root.size() || path.substr(0, root.size()) != root) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

absl::StatusOr<std::vector<std::string>> ParseRoots(absl::string_view value,
                                                    absl::string_view flag) {
  std::vector<std::string> roots;
  for (const absl::string_view item : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    absl::StatusOr<std::string> root = NormalizeSpecPath(absl::StripAsciiWhitespace(item), flag);
    if (!root.ok()) return root.status();
    roots.push_back(*std::move(root));
  }
  return roots;
}

absl::Status CheckUnderRoots(absl::string_view path, const std::vector<std::string>& roots,
                             absl::string_view field, absl::string_view flag) {
  if (roots.empty()) return absl::OkStatus();
  for (const std::string& root : roots) {
    if (IsUnderRoot(path, root)) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(field, ": ", Echo(path), " is outside the directories this cluster allows (",
                   absl::StrJoin(roots, ", "),
                   "); use a path under one of them (the operator sets ", "them with ", flag, ")"));
}

}  // namespace loom
