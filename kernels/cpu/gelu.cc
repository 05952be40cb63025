// CPU fp32 GELU (tanh approximation). Contract: kernels/gelu.h.
// Threading: elementwise, static split across OpenMP threads; order-independent.
#include "kernels/gelu.h"

#include <cmath>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubic = 0.044715f;

}  // namespace

void gelu_forward(float* out, const float* inp, long n) {
  LOOM_KERNEL_CHECK(out && inp, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long n) {
  LOOM_KERNEL_CHECK(dinp && inp && dout, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx.
    const float grad =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] += grad * dout[i];
  }
}

}  // namespace loom::kernels::cpu
