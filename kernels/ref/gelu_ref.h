// Double-precision reference of GELU (tanh approximation), for tests only.
// Same contracts as kernels/gelu.h, with double buffers.
#ifndef LOOM_KERNELS_REF_GELU_REF_H_
#define LOOM_KERNELS_REF_GELU_REF_H_

namespace loom::kernels::ref {

// out (n) = gelu(inp (n)).
void gelu_forward(double* out, const double* inp, long n);
// dinp (n) += gelu'(inp) * dout. Accumulates.
void gelu_backward(double* dinp, const double* inp, const double* dout, long n);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_GELU_REF_H_
