#include "worker/train/comm/collective_log.h"

#include <atomic>
#include <cstdint>

namespace loom::train::collective_log {
namespace {

std::atomic<uint64_t> counts[kKinds];
constexpr const char* kNames[kKinds] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                        "barrier",    "send",           "recv"};

// Appends `text` at `*at` without passing `size - 1`.
void Put(char* out, size_t size, size_t* at, const char* text) {
  for (; *text != '\0' && *at + 1 < size; ++text) out[(*at)++] = *text;
}

void PutNumber(char* out, size_t size, size_t* at, uint64_t value) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (n > 0 && *at + 1 < size) out[(*at)++] = digits[--n];
}

}  // namespace

void Note(Kind kind) { counts[kind].fetch_add(1, std::memory_order_relaxed); }

size_t Format(char* out, size_t size) {
  if (size == 0) return 0;
  size_t at = 0;
  Put(out, size, &at, "last collectives:");
  for (int k = 0; k < kKinds; ++k) {
    Put(out, size, &at, k == 0 ? " " : ", ");
    Put(out, size, &at, kNames[k]);
    Put(out, size, &at, " #");
    PutNumber(out, size, &at, counts[k].load(std::memory_order_relaxed));
  }
  Put(out, size, &at, "\n");
  out[at] = '\0';
  return at;
}

}  // namespace loom::train::collective_log
