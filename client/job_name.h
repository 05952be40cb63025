// Job names as users type them: "abc" and "jobs/abc" both mean the resource jobs/abc.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::client {

// Returns "jobs/{id}". INVALID_ARGUMENT (naming the argument and the expected form) for an
// empty id, another collection ("nodes/x"), or an id containing '/' or whitespace.
absl::StatusOr<std::string> NormalizeJobName(absl::string_view arg);

// The id part of "jobs/{id}" (the name itself when it has no "jobs/" prefix), for tables.
absl::string_view ShortJobId(absl::string_view name);

}  // namespace loom::client
