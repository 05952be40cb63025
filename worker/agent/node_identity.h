// What the worker says about its node: its id, its CPU devices, and where the rank program is.
// Threading: pure functions (or reads of /proc and uname), thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/v1/node.pb.h"

namespace loom::worker {

// A node id for loomd from a hostname: lower-cased, every character outside [a-z0-9-] replaced
// by '-', runs of '-' collapsed, leading/trailing '-' trimmed, at most 63 characters; "node" when
// nothing is left. The domain part of a FQDN is kept ("gpu1.rack2" -> "gpu1-rack2").
std::string SanitizeNodeId(std::string_view hostname);

// True when `id` is a valid node id: 1..63 characters of [a-z0-9-], not starting or ending
// with '-'.
bool IsValidNodeId(std::string_view id);

// This machine's hostname (uname), or "localhost" when it cannot be read.
std::string Hostname();

// `count` CPU devices of kind CPU, indices 0..count-1, model "cpu", each with an equal share of
// the machine's physical memory.
std::vector<loom::v1::Device> CpuDevices(int count);

// The directory of the running executable (via /proc/self/exe).
absl::StatusOr<std::string> ExecutableDir();

}  // namespace loom::worker
