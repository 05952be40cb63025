// The paths of a job spec (data.path, data.val_path, checkpoint.dir): lexical normalisation and
// the operator's allow-list of roots. loomd applies both at CreateJob without touching the file
// system; loom-worker applies them again after resolving symbolic links on its own node
// (worker/agent/path_confinement.h), since only there is the path's real target known.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// Longest accepted spec path: leaves room below PATH_MAX for the job's own folders and files.
inline constexpr size_t kMaxSpecPathBytes = 1024;

// `path` normalised lexically: absolute, without NUL bytes, without ".." components (which only
// the file system could resolve correctly), with "//", "/./" and a trailing "/" collapsed, and
// at most kMaxSpecPathBytes long. INVALID_ARGUMENT naming `field` and the fix otherwise.
absl::StatusOr<std::string> NormalizeSpecPath(absl::string_view path, absl::string_view field);

// Whether the normalised `path` is `root` or below it, by whole components ("/data2" is not
// below "/data").
bool IsUnderRoot(absl::string_view path, absl::string_view root);

// Parses a DIR[,DIR...] flag value: each normalised, empty items skipped. INVALID_ARGUMENT naming
// `flag` for a bad item.
absl::StatusOr<std::vector<std::string>> ParseRoots(absl::string_view value,
                                                    absl::string_view flag);

// OK when `roots` is empty (no allow-list) or the normalised `path` is under one of them;
// otherwise FAILED_PRECONDITION (the operator's configuration refuses it; exit 2 in loomctl) naming
// `field`, the roots and the `flag` that sets them.
absl::Status CheckUnderRoots(absl::string_view path, const std::vector<std::string>& roots,
                             absl::string_view field, absl::string_view flag);

}  // namespace loom
