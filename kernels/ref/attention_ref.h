// Double-precision reference of causal multi-head self-attention, for tests only.
// Same contracts as kernels/attention.h, with double buffers.
#ifndef LOOM_KERNELS_REF_ATTENTION_REF_H_
#define LOOM_KERNELS_REF_ATTENTION_REF_H_

namespace loom::kernels::ref {

// out (B,T,C); att (B,NH,T,T) (masked upper triangle written 0); qkv (B,T,3C).
void attention_forward(double* out, double* att, const double* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) += gradient; scratch at least B*NH*T*T, overwritten. Accumulates.
void attention_backward(double* dqkv, double* scratch, const double* dout, const double* qkv,
                        const double* att, int B, int T, int C, int NH);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_ATTENTION_REF_H_
