// Causal multi-head self-attention (after the QKV projection, before the output projection).
// Conventions (shapes, forward overwrites, backward accumulates): see kernels/README.md.
//
// qkv (B,T,3C) holds, per token, [q | k | v], each (C) = (NH,HS) with HS = C/NH.
// For each (b, h): att = softmax(q k^T / sqrt(HS) with a causal mask), out = att v.
#ifndef LOOM_KERNELS_ATTENTION_H_
#define LOOM_KERNELS_ATTENTION_H_

namespace loom::kernels::cpu {

// out (B,T,C): per head h, channels [h*HS, (h+1)*HS) hold att_h @ v_h.
// att (B,NH,T,T): the softmax probabilities, saved for backward. Row t holds valid entries in
// columns [0, t]; the masked upper triangle is written 0.
// C must be divisible by NH.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

// dqkv (B,T,3C) += gradient w.r.t. qkv, given dout (B,T,C), qkv and att from the forward.
// scratch: at least B*NH*T*T floats, overwritten (holds d(att) and d(scores)). Accumulates.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_ATTENTION_H_
