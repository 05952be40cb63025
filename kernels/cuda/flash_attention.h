// Fused causal self-attention on bf16 device buffers ("flash" attention): queries and keys in
// tiles held in shared memory, the softmax computed online (a running row maximum and sum), so
// neither the (B, NH, T, T) scores nor the probabilities ever exist in device memory. The forward
// keeps the log-sum-exp of each query row (fp32) for the backward, which recomputes the
// probabilities tile by tile. Products on the tensor cores (16x16x16 bf16, fp32 accumulate).
//
// Same contract and qkv layout as kernels/cuda/attention.h (the unfused path, which this
// replaces where launch::FlashAttentionSupported(C, NH)): qkv (B, T, 3C) = [q | k | v], head h at
// channels [h*HS, (h+1)*HS) of each. Precision as the unfused path: bf16 operands, fp32 scores,
// softmax statistics and accumulation; the probabilities are rounded to bf16 before they
// multiply v (the unfused path stores them in bf16).
//
// Determinism: no atomics. The dK/dV kernel owns a block of keys and the dQ kernel a block of
// queries, each summing over the other dimension in a fixed order, so results are bit-for-bit
// reproducible. The price is computing the scores and d(probabilities) twice in backward.
#ifndef LOOM_KERNELS_CUDA_FLASH_ATTENTION_H_
#define LOOM_KERNELS_CUDA_FLASH_ATTENTION_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (B, T, C) bf16: per head, softmax(q k^T / sqrt(HS), causal) v.
// lse (B, NH, T) fp32: per query row, max + log(sum exp) of its scaled scores (natural log).
// Requires launch::FlashAttentionSupported(C, NH); all pointers device memory.
void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream);

// dqkv (B, T, 3C) += the gradient with respect to qkv, given dout (B, T, C), and out, lse and qkv
// of the forward. scratch: launch::FlashAttentionScratchBytes(B, T, NH) bytes of device memory,
// overwritten (the per-row D = sum(dout * out)).
void flash_attention_backward(bf16* dqkv, void* scratch, const bf16* dout, const bf16* out,
                              const bf16* qkv, const float* lse, int B, int T, int C, int NH,
                              cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_FLASH_ATTENTION_H_
