// Causal multi-head self-attention on bf16 device buffers: cuBLAS strided-batched GEMMs (bf16
// operands, fp32 compute) for Q K^T and att V, and a fused scale + causal mask + softmax kernel.
// CPU contract and the qkv layout: kernels/attention.h. Conventions: kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_ATTENTION_H_
#define LOOM_KERNELS_CUDA_ATTENTION_H_

#include "kernels/cuda/gemm_context.h"
#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (B,T,C): per head h, channels [h*HS, (h+1)*HS) hold att_h @ v_h. qkv (B,T,3C).
// att (B,NH,T,T): the softmax probabilities in bf16, saved for backward; the masked upper
// triangle is written 0. The scores are computed and normalised in fp32 (never rounded to bf16
// before the softmax).
// scratch: device memory of launch::AttentionScratchBytes(T, NH) bytes, 256-byte aligned,
// overwritten (fp32 scores of one batch element at a time). C must be divisible by NH.
void attention_forward(GemmContext& ctx, bf16* out, bf16* att, void* scratch, const bf16* qkv,
                       int B, int T, int C, int NH, cudaStream_t stream);

// dqkv (B,T,3C) += gradient w.r.t. qkv, given dout (B,T,C), qkv and att from the forward.
// Accumulates (GEMMs with beta = 1). scratch as for the forward, overwritten (fp32 d(att) and
// bf16 d(scores) of one batch element at a time).
void attention_backward(GemmContext& ctx, bf16* dqkv, void* scratch, const bf16* dout,
                        const bf16* qkv, const bf16* att, int B, int T, int C, int NH,
                        cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_ATTENTION_H_
