// CPU fp32 token + position embedding. Contract: kernels/encoder.h.
//
// Threading: forward splits the N = B*T rows statically across OpenMP threads. Backward splits
// the C channels into fixed chunks, and each thread walks all rows for its chunks in (b, t)
// order: no two threads touch the same gradient element, and every element is summed in the
// same order whatever the thread count, so the result is bit-for-bit reproducible.
#include "kernels/encoder.h"

#include <algorithm>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

// Channels per backward work item: 64 floats = one 256-byte run per row, enough to vectorise.
constexpr int kChannelChunk = 64;

void CheckArgs(const int* tokens, int B, int T, int C) {
  LOOM_KERNEL_CHECK(B > 0 && T > 0 && C > 0, "B, T and C must be positive");
  const long n = static_cast<long>(B) * T;
  for (long i = 0; i < n; ++i) {
    LOOM_KERNEL_CHECK(tokens[i] >= 0, "token ids must be non-negative");
  }
}

}  // namespace

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
  LOOM_KERNEL_CHECK(out && tokens && wte && wpe, "null buffer");
  CheckArgs(tokens, B, T, C);
  const long rows = static_cast<long>(B) * T;
#pragma omp parallel for schedule(static)
  for (long r = 0; r < rows; ++r) {
    const long t = r % T;
    float* out_r = out + r * C;                                   // (C)
    const float* wte_r = wte + static_cast<long>(tokens[r]) * C;  // (C)
    const float* wpe_t = wpe + t * C;                             // (C)
    for (int c = 0; c < C; ++c) out_r[c] = wte_r[c] + wpe_t[c];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C) {
  LOOM_KERNEL_CHECK(dwte && dwpe && dout && tokens, "null buffer");
  CheckArgs(tokens, B, T, C);
  const int chunks = (C + kChannelChunk - 1) / kChannelChunk;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < chunks; ++k) {
    const int c0 = k * kChannelChunk;
    const int c1 = std::min(C, c0 + kChannelChunk);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const long r = static_cast<long>(b) * T + t;
        const float* dout_r = dout + r * C;                       // (C)
        float* dwte_r = dwte + static_cast<long>(tokens[r]) * C;  // (C)
        float* dwpe_t = dwpe + static_cast<long>(t) * C;          // (C)
        for (int c = c0; c < c1; ++c) {
          dwte_r[c] += dout_r[c];
          dwpe_t[c] += dout_r[c];
        }
      }
    }
  }
}

}  // namespace loom::kernels::cpu
