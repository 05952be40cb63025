// CPU fp32 residual add. Contract: kernels/residual.h.
// Threading: elementwise, static split across OpenMP threads; order-independent.
#include "kernels/residual.h"

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {

void residual_forward(float* out, const float* a, const float* b, long n) {
  LOOM_KERNEL_CHECK(out && a && b, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, long n) {
  LOOM_KERNEL_CHECK(da && db && dout, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  LOOM_KERNEL_CHECK(da != db, "da and db must not alias");
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace loom::kernels::cpu
