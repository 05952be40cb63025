// Fused softmax + cross-entropy over V classes on bf16 logits, fp32 losses.
// CPU contract: kernels/crossentropy.h; unlike it, the probabilities are never written: the
// forward saves one fp32 log-sum-exp per row and the backward recomputes each probability as
// exp(logit - lse) in the same pass that writes the gradient. Conventions: kernels/cuda/README.md.
//
// Padded vocabulary: logits rows have Vp >= V columns (e.g. V = 50257, Vp = 50304 so the lm_head
// GEMM has a multiple-of-64 dimension); only the first V take part, the others are never read
// and their gradient never written.
#ifndef LOOM_KERNELS_CUDA_CROSSENTROPY_H_
#define LOOM_KERNELS_CUDA_CROSSENTROPY_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// losses (N) = -log softmax(logits[n, :V])[targets[n]]; lse (N) = log sum_j exp(logits[n, j]),
// both fp32. logits (N,Vp) bf16; targets (N) device ints in [0, V): a target out of range is
// not checked on the host (it lives on the device) but gives a NaN loss, never a wild read.
void softmax_crossentropy_forward(float* losses, float* lse, const bf16* logits, const int* targets,
                                  int N, int V, int Vp, cudaStream_t stream);

// dlogits[n, j] += (exp(logits[n, j] - lse[n]) - [j == targets[n]]) * dlosses[n] for j < V.
// dlosses (N) fp32, e.g. 1/N each for a mean loss. Accumulates. dlogits (N,Vp) must not alias
// logits.
void softmax_crossentropy_backward(bf16* dlogits, const bf16* logits, const float* lse,
                                   const int* targets, const float* dlosses, int N, int V, int Vp,
                                   cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_CROSSENTROPY_H_
