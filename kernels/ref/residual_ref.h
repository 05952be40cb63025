// Double-precision reference of the residual add, for tests only.
// Same contracts as kernels/residual.h, with double buffers.
#ifndef LOOM_KERNELS_REF_RESIDUAL_REF_H_
#define LOOM_KERNELS_REF_RESIDUAL_REF_H_

namespace loom::kernels::ref {

// out (n) = a + b.
void residual_forward(double* out, const double* a, const double* b, long n);
// da, db (n) += dout. Accumulates.
void residual_backward(double* da, double* db, const double* dout, long n);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_RESIDUAL_REF_H_
