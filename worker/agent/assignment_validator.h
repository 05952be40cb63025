// Checks an Assignment from loomd before anything is launched. loomd is trusted to be correct,
// but nothing it sends may crash the worker or make it launch something inconsistent: an invalid
// assignment is reported as a PERMANENT failure of each of its ranks, never acted upon.
//
// Threading: pure functions, thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/v1/node.pb.h"

namespace loom::worker {

// Bounds on what one assignment may ask of a node. Beyond these an assignment is absurd.
inline constexpr int kMaxRanksPerAssignment = 1024;
inline constexpr int kMaxWorldSize = 1 << 20;
inline constexpr int kMaxNodes = 1 << 16;

// Returns the {job} of "jobs/{job}", which names a directory on this node: 1..128 characters of
// [A-Za-z0-9._-], neither "." nor "..". INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> JobIdFromName(absl::string_view job_name);

// OK when `assignment` can be launched on a node with `devices`: a job name, generation >= 1,
// world size, node count and layout consistent with each other, ranks unique and in range, local
// ranks a permutation of 0..n-1, each device present in `devices` and used once, spec.env names
// valid and not in the LOOM_ namespace. INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateAssignment(const loom::v1::Assignment& assignment,
                                const std::vector<loom::v1::Device>& devices);

}  // namespace loom::worker
