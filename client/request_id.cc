#include "client/request_id.h"

#include <sys/random.h>

#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"

namespace loom::client {

std::string NewRequestId() {
  // getrandom(2) first: std::random_device's set-up probes the CPU with CPUID instructions,
  // which a virtual machine traps (tens of microseconds of a short-lived loomctl on the VMs
  // measured in docs/benchmarks.md).
  uint64_t words[2];
  if (::getrandom(words, sizeof(words), 0) != static_cast<ssize_t>(sizeof(words))) {
    std::random_device rd;  // /dev/urandom on Linux
    words[0] = (static_cast<uint64_t>(rd()) << 32) | rd();
    words[1] = (static_cast<uint64_t>(rd()) << 32) | rd();
  }
  return absl::StrFormat("%016x%016x", words[0], words[1]);
}

}  // namespace loom::client
