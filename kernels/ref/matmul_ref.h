// Double-precision reference of the fully connected layer, for tests only.
// Same contracts as kernels/matmul.h, with double buffers.
#ifndef LOOM_KERNELS_REF_MATMUL_REF_H_
#define LOOM_KERNELS_REF_MATMUL_REF_H_

namespace loom::kernels::ref {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be nullptr.
void matmul_forward(double* out, const double* inp, const double* weight, const double* bias, int N,
                    int C, int OC);
// dinp (N,C) (may be nullptr), dweight (OC,C), dbias (OC) (may be nullptr) += gradients.
void matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout,
                     const double* inp, const double* weight, int N, int C, int OC);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_MATMUL_REF_H_
