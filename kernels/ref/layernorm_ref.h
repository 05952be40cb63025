// Double-precision reference of layernorm (eps = 1e-5), for tests only.
// Same contracts as kernels/layernorm.h, with double buffers.
#ifndef LOOM_KERNELS_REF_LAYERNORM_REF_H_
#define LOOM_KERNELS_REF_LAYERNORM_REF_H_

namespace loom::kernels::ref {

// out (N,C); mean, rstd (N); inp (N,C); weight, bias (C).
void layernorm_forward(double* out, double* mean, double* rstd, const double* inp,
                       const double* weight, const double* bias, int N, int C);
// dinp (N,C), dweight (C), dbias (C) += gradients. Accumulates.
void layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout,
                        const double* inp, const double* weight, const double* mean,
                        const double* rstd, int N, int C);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_LAYERNORM_REF_H_
