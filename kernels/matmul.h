// Fully connected layer: a GEMM with an optional bias.
// Conventions (shapes, forward overwrites, backward accumulates): see kernels/README.md.
#ifndef LOOM_KERNELS_MATMUL_H_
#define LOOM_KERNELS_MATMUL_H_

namespace loom::kernels::cpu {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC). bias may be nullptr (no bias).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);

// dinp (N,C) += dout (N,OC) @ weight (OC,C)        (skipped when dinp is nullptr)
// dweight (OC,C) += dout^T @ inp (N,C)
// dbias (OC) += sum_n dout                          (skipped when dbias is nullptr)
// Accumulates.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_MATMUL_H_
