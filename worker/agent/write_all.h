// WriteAllAndClose: the worker's one loop for writing a whole file through a descriptor (the
// job's spec.json, whether written fresh or into a directory made ahead of time).
#pragma once

#include <string_view>

namespace loom::worker {

// Writes all of `content` to `fd` (retrying short writes and EINTR), then closes `fd`, which is
// closed in every case. Returns 0, or the errno of the first failure; a write that makes no
// progress counts as ENOSPC.
int WriteAllAndClose(int fd, std::string_view content);

}  // namespace loom::worker
