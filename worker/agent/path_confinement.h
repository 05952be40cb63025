// Confines a job's spec paths to this worker's roots (--data-roots, --checkpoint-roots), on the
// node where they are used. loomd checks the same paths lexically at create
// (common/spec_path.h); here symbolic links are resolved first, so that a link inside a root
// pointing out of it is refused, and the data files are checked to exist as regular files.
// Nothing here opens a user's file, and no error echoes a file's size or contents.
//
// Threading: thread-safe (reads the file system only).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"

namespace loom::worker {

// Roots as given on the command line (absolute); they are resolved themselves when checked.
struct PathRoots {
  std::vector<std::string> data;
  std::vector<std::string> checkpoint;
};

// `path` (absolute) with symbolic links resolved in its longest existing prefix (realpath) and
// the rest appended lexically (".." in the rest is refused). INVALID_ARGUMENT for a relative
// path, FAILED_PRECONDITION with the errno text when the prefix cannot be resolved.
absl::StatusOr<std::string> ResolveExistingPrefix(const std::string& path);

// Checks spec.data.path and val_path (under `roots.data` once resolved, and existing regular
// files) and spec.checkpoint.dir (under `roots.checkpoint` once resolved). An empty root list
// allows everything. Errors name the field: FAILED_PRECONDITION outside the roots or for a
// missing or non-regular data file, INVALID_ARGUMENT for a malformed path. Every one is permanent
// for the job.
absl::Status CheckSpecPathsOnNode(const loom::v1::JobSpec& spec, const PathRoots& roots);

}  // namespace loom::worker
