// Layer normalisation over the channel dimension, with affine weight and bias (eps = 1e-5).
// Conventions (shapes, forward overwrites, backward accumulates): see kernels/README.md.
#ifndef LOOM_KERNELS_LAYERNORM_H_
#define LOOM_KERNELS_LAYERNORM_H_

namespace loom::kernels {

// The epsilon added to the variance, as in GPT-2.
inline constexpr float kLayerNormEps = 1e-5f;

}  // namespace loom::kernels

namespace loom::kernels::cpu {

// out (N,C) = (inp - mean) * rstd * weight + bias, per row of inp (N,C).
// mean (N), rstd (N): written, saved for backward (rstd = 1/sqrt(var + eps), biased variance).
// weight (C), bias (C).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);

// dinp (N,C) += d/dinp; dweight (C) += sum_n dout*norm; dbias (C) += sum_n dout.
// dout, inp (N,C); weight (C); mean, rstd (N) as written by layernorm_forward. Accumulates.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_LAYERNORM_H_
