// CPU fp32 AdamW update. Contract: kernels/adamw.h.
// Threading: elementwise, static split across OpenMP threads; order-independent.
#include "kernels/adamw.h"

#include <cmath>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {

void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
  LOOM_KERNEL_CHECK(params && grads && m && v, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  LOOM_KERNEL_CHECK(t >= 1, "t is the 1-based step");
  LOOM_KERNEL_CHECK(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f,
                    "betas must lie in [0, 1)");
  LOOM_KERNEL_CHECK(eps > 0.0f, "eps must be positive");
  // Bias corrections in double: beta^t for large t is where float pow loses digits.
  const float correction1 = static_cast<float>(1.0 - std::pow(double{beta1}, t));
  const float correction2 = static_cast<float>(1.0 - std::pow(double{beta2}, t));
  const float inv_c1 = 1.0f / correction1;
  const float inv_c2 = 1.0f / correction2;
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * inv_c1;
    const float vhat = vi * inv_c2;
    params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * params[i]);
  }
}

}  // namespace loom::kernels::cpu
