// Token + position embedding ("encoder") of GPT-2 on bf16 device buffers.
// CPU contract: kernels/encoder.h. Conventions: kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_ENCODER_H_
#define LOOM_KERNELS_CUDA_ENCODER_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t], summed in fp32.
// tokens (B,T) device ints, each in [0, V) (not checked on device: the data loader validates
// them); wte (V,C); wpe (maxT,C) with maxT >= T.
void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T,
                     int C, cudaStream_t stream);

// dwte (V,C) += scatter of dout (B,T,C) by token; dwpe (maxT,C) += sum over b of dout[b,t].
// Accumulates. Deterministic, without atomics: for every token id, the block that owns its first
// occurrence in (b, t) order sums all of its rows in that order in fp32 and adds the total to
// dwte once (one bf16 rounding per call); dwpe sums over b in order. Cost: O(N * C) reads plus
// an O(N^2) comparison of token ids (N = B*T), in shared memory. Estimated well under a
// millisecond at N = 4096 and a few milliseconds at N = 65536; beyond that, sorting
// (token, row) keys on the device (e.g. a radix sort) would make it O(N log N).
void encoder_backward(bf16* dwte, bf16* dwpe, const bf16* dout, const int* tokens, int B, int T,
                      int C, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_ENCODER_H_
