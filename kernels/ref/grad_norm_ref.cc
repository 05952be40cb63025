// Double-precision reference: sum of squares. Contract: grad_norm_ref.h.
#include "kernels/ref/grad_norm_ref.h"

namespace loom::kernels::ref {

double sum_of_squares(const double* x, long n) {
  double sum = 0.0;
  for (long i = 0; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

}  // namespace loom::kernels::ref
