// Double-precision reference: GELU, tanh approximation. Contract: gelu_ref.h.
#include "kernels/ref/gelu_ref.h"

#include <cmath>
#include <numbers>

namespace loom::kernels::ref {
namespace {

const double kSqrt2OverPi = std::sqrt(2.0 / std::numbers::pi);
constexpr double kCubic = 0.044715;

}  // namespace

void gelu_forward(double* out, const double* inp, long n) {
  for (long i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

void gelu_backward(double* dinp, const double* inp, const double* dout, long n) {
  for (long i = 0; i < n; ++i) {
    const double x = inp[i];
    const double th = std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
    dinp[i] += (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du) * dout[i];
  }
}

}  // namespace loom::kernels::ref
