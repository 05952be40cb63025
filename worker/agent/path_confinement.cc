#include "worker/agent/path_confinement.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/spec_path.h"
#include "worker/agent/launcher.h"

namespace loom::worker {
namespace {

// The roots resolved like the paths (a root may itself be a link, e.g. /tmp on some systems).
absl::StatusOr<std::vector<std::string>> ResolveRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> out;
  for (const std::string& root : roots) {
    absl::StatusOr<std::string> resolved = ResolveExistingPrefix(root);
    if (!resolved.ok()) return resolved.status();
    out.push_back(*std::move(resolved));
  }
  return out;
}

absl::Status CheckOne(const std::string& path, const std::vector<std::string>& roots,
                      const std::string& field, const std::string& flag, bool data_file) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> normal = NormalizeSpecPath(path, field);
  if (!normal.ok()) return normal.status();
  absl::StatusOr<std::string> resolved = ResolveExistingPrefix(*normal);
  if (!resolved.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": ", Echo(path), ": ", resolved.status().message()));
  }
  absl::StatusOr<std::vector<std::string>> resolved_roots = ResolveRoots(roots);
  if (!resolved_roots.ok()) return resolved_roots.status();
  if (!roots.empty()) {
    bool inside = false;
    for (const std::string& root : *resolved_roots) inside = inside || IsUnderRoot(*resolved, root);
    if (!inside) {
      const bool through_link = *resolved != *normal;
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": ", Echo(path),
          through_link ? " resolves (through a symbolic link) to a path" : "",
          " outside this worker's directories (", absl::StrJoin(roots, ", "),
          "); use a path under one of them (the operator sets them with loom-worker ", flag, ")"));
    }
  }
  if (data_file) {
    struct stat info {};
    if (::stat(resolved->c_str(), &info) != 0) {
      const int err = errno;
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": ", Echo(path), ": ", ErrnoText(err),
                       " on this node; give the path of a token file readable on every worker"));
    }
    if (!S_ISREG(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": ", Echo(path),
                       S_ISDIR(info.st_mode) ? " is a directory" : " is not a regular file",
                       "; give the path of a token file"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ResolveExistingPrefix(const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(Echo(path), " is not an absolute path"));
  }
  // Walk up to the longest prefix that exists, then resolve it and append the rest.
  std::string prefix = path;
  std::string rest;
  for (;;) {
    char buffer[PATH_MAX];
    if (::realpath(prefix.c_str(), buffer) != nullptr) {
      std::string out = buffer;
      if (!rest.empty()) out = out == "/" ? rest : out + rest;
      absl::StatusOr<std::string> normal = NormalizeSpecPath(out, "path");
      if (!normal.ok()) return absl::InvalidArgumentError(normal.status().message());
      return *normal;
    }
    const int err = errno;
    if (err != ENOENT && err != ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot resolve ", Echo(prefix), ": ", ErrnoText(err)));
    }
    const size_t slash = prefix.find_last_of('/');
    if (slash == 0 && prefix.size() == 1) {
      return absl::FailedPreconditionError("cannot resolve \"/\"");
    }
    rest = prefix.substr(slash) + rest;
    prefix = slash == 0 ? "/" : prefix.substr(0, slash);
  }
}

absl::Status CheckSpecPathsOnNode(const loom::v1::JobSpec& spec, const PathRoots& roots) {
  if (absl::Status s =
          CheckOne(spec.data().path(), roots.data, "spec.data.path", "--data-roots", true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckOne(spec.data().val_path(), roots.data, "spec.data.val_path", "--data-roots", true);
      !s.ok()) {
    return s;
  }
  return CheckOne(spec.checkpoint().dir(), roots.checkpoint, "spec.checkpoint.dir",
                  "--checkpoint-roots", false);
}

}  // namespace loom::worker
