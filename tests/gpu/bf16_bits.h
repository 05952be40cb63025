// bf16 bits <-> float on the host, as the device converts (round to nearest even; NaN stays a
// quiet NaN): for the op checks' references, the communication check's patterns and the CPU
// emulation's stand-in for NCCL, which rounds bf16 sums as NCCL does.
#ifndef LOOM_TESTS_GPU_BF16_BITS_H_
#define LOOM_TESTS_GPU_BF16_BITS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace loom::gpu_check {

inline std::uint16_t FloatToBf16Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

inline float Bf16BitsToFloat(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace loom::gpu_check

#endif  // LOOM_TESTS_GPU_BF16_BITS_H_
