// How errors quote a user's input: at most kMaxEchoBytes of it, in double quotes, with control
// and non-ASCII bytes written as \xNN, and "..." (plus the full length) when cut. An error never
// repeats a whole value, which may be long, binary, or a secret.
//
// Pure; thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace loom {

inline constexpr size_t kMaxEchoBytes = 64;

// `"abc"`, or `"first 64 bytes..." (1000 bytes)` when longer than kMaxEchoBytes.
std::string Echo(absl::string_view input);

}  // namespace loom
