// Double-precision reference of the AdamW update, for tests only.
// Same contract as kernels/adamw.h, with double buffers.
#ifndef LOOM_KERNELS_REF_ADAMW_REF_H_
#define LOOM_KERNELS_REF_ADAMW_REF_H_

namespace loom::kernels::ref {

// params, m, v (n) updated in place from grads (n); t >= 1.
void adamw_update(double* params, const double* grads, double* m, double* v, long n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int t);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_ADAMW_REF_H_
