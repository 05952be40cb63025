// CPU fp32 layernorm. Contract: kernels/layernorm.h.
//
// Threading: rows are split statically across OpenMP threads (forward, and the dinp part of
// backward). dweight and dbias are reductions over rows: the channels are cut into fixed chunks
// and one thread owns a chunk and walks every row in order, so there are no races and the
// summation order does not depend on the thread count. Row reductions use `omp simd reduction`,
// whose order is fixed by the compiled code, hence reproducible.
#include "kernels/layernorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

constexpr int kChannelChunk = 64;

void CheckSizes(int N, int C) { LOOM_KERNEL_CHECK(N > 0 && C > 0, "N and C must be positive"); }

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  LOOM_KERNEL_CHECK(out && mean && rstd && inp && weight && bias, "null buffer");
  CheckSizes(N, C);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;  // (C)
    float* y = out + static_cast<long>(n) * C;        // (C)
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += x[c];
    const float m = sum / C;
    // Two-pass variance: sum of squared deviations, no cancellation from E[x^2] - E[x]^2.
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sq / C + kLayerNormEps);
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  LOOM_KERNEL_CHECK(dinp && dweight && dbias && dout && inp && weight && mean && rstd,
                    "null buffer");
  CheckSizes(N, C);
  // dinp: with xhat = (x - m) s and g = dout * weight,
  //   dx = s (g - mean_c(g) - xhat mean_c(g xhat)).
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;    // (C)
    const float* dy = dout + static_cast<long>(n) * C;  // (C)
    float* dx = dinp + static_cast<long>(n) * C;        // (C)
    const float m = mean[n];
    const float s = rstd[n];
    float sum_g = 0.0f;
    float sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int c = 0; c < C; ++c) {
      const float g = dy[c] * weight[c];
      sum_g += g;
      sum_gx += g * (x[c] - m) * s;
    }
    const float mean_g = sum_g / C;
    const float mean_gx = sum_gx / C;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      dx[c] += s * (dy[c] * weight[c] - mean_g - xhat * mean_gx);
    }
  }
  // dweight, dbias: per channel sums over rows; one thread per channel chunk.
  const int chunks = (C + kChannelChunk - 1) / kChannelChunk;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < chunks; ++k) {
    const int c0 = k * kChannelChunk;
    const int c1 = std::min(C, c0 + kChannelChunk);
    float acc_w[kChannelChunk] = {};
    float acc_b[kChannelChunk] = {};
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* dy = dout + static_cast<long>(n) * C;
      const float m = mean[n];
      const float s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        acc_w[c - c0] += dy[c] * (x[c] - m) * s;
        acc_b[c - c0] += dy[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dweight[c] += acc_w[c - c0];
      dbias[c] += acc_b[c - c0];
    }
  }
}

}  // namespace loom::kernels::cpu
