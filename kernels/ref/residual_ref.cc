// Double-precision reference: residual add. Contract: residual_ref.h.
#include "kernels/ref/residual_ref.h"

namespace loom::kernels::ref {

void residual_forward(double* out, const double* a, const double* b, long n) {
  for (long i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(double* da, double* db, const double* dout, long n) {
  for (long i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace loom::kernels::ref
