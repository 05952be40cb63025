// Layer normalisation (eps = kLayerNormEps = 1e-5, biased variance) on bf16 device buffers, with
// fp32 statistics. CPU contract: kernels/layernorm.h. Conventions: kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_LAYERNORM_H_
#define LOOM_KERNELS_CUDA_LAYERNORM_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (N,C) = (inp - mean) * rstd * weight + bias per row of inp (N,C); mean, rstd (N) fp32,
// written for the backward. weight, bias (C). One warp per row; two-pass variance.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                       const bf16* bias, int N, int C, cudaStream_t stream);

// Fused residual add + layernorm, one pass over the rows instead of two:
//   residual (N,C) = a + b (rounded to bf16), then layernorm_forward of residual.
// Bit-identical to residual_forward followed by layernorm_forward. residual may alias a or b;
// out must not alias a, b or residual.
void residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                cudaStream_t stream);

// dinp (N,C) += d/dinp; dweight (C) += sum_n dout * xhat; dbias (C) += sum_n dout.
// dout, inp (N,C); weight (C); mean, rstd (N) from the forward. Accumulates.
// scratch: launch::LayerNormBackwardScratchFloats(N, C) fp32, overwritten (per-chunk partial
// sums of the weight and bias gradients; deterministic two-pass column reduction).
void layernorm_backward(bf16* dinp, bf16* dweight, bf16* dbias, float* scratch, const bf16* dout,
                        const bf16* inp, const bf16* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_LAYERNORM_H_
