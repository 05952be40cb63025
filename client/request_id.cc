#include "client/request_id.h"

#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"

namespace loom::client {

std::string NewRequestId() {
  std::random_device rd;  // /dev/urandom on Linux
  uint64_t hi = (static_cast<uint64_t>(rd()) << 32) | rd();
  uint64_t lo = (static_cast<uint64_t>(rd()) << 32) | rd();
  return absl::StrFormat("%016x%016x", hi, lo);
}

}  // namespace loom::client
