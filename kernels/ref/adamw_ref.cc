// Double-precision reference: AdamW update. Contract: adamw_ref.h.
#include "kernels/ref/adamw_ref.h"

#include <cmath>

namespace loom::kernels::ref {

void adamw_update(double* params, const double* grads, double* m, double* v, long n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int t) {
  for (long i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + (1.0 - beta1) * grads[i];
    v[i] = beta2 * v[i] + (1.0 - beta2) * grads[i] * grads[i];
    const double mhat = m[i] / (1.0 - std::pow(beta1, t));
    const double vhat = v[i] / (1.0 - std::pow(beta2, t));
    params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * params[i]);
  }
}

}  // namespace loom::kernels::ref
