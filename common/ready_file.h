// The ready file: a daemon started with --ready-file=PATH writes its bound addresses there once
// it serves, so scripts and tests wait for the file instead of guessing ports or sleeping.
//   {"grpc":"127.0.0.1:41234","metrics":"127.0.0.1:41235","pid":"1234"}
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

// Writes `fields` as one flat JSON object of strings, atomically: a temp file next to `path` is
// written, fsynced and renamed over `path`, and the directory is fsynced, so a reader sees either
// no file or the whole file. Duplicate keys: the last one wins. Errors name the path.
absl::Status WriteReadyFile(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& fields);

// Reads a ready file. NOT_FOUND when it does not exist (yet); INVALID_ARGUMENT when it is not a
// flat JSON object of strings.
absl::StatusOr<std::map<std::string, std::string>> ReadReadyFile(const std::string& path);

}  // namespace loom
