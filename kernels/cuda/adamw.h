// AdamW on device: fp32 master weights and moments, bf16 gradients in, bf16 weights out.
// CPU contract: kernels/adamw.h. Conventions: kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_ADAMW_H_
#define LOOM_KERNELS_CUDA_ADAMW_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// For each i in [0, n), in fp32, with g = grad_scale * grads[i]:
//   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
//   mhat = m / (1 - beta1^t);   vhat = v / (1 - beta2^t)
//   master -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * master)
//   params = bf16(master)       (the copy the forward and backward read)
// master, m, v (n) fp32, updated in place; grads (n) bf16, read; params (n) bf16, written.
// weight_decay is applied exactly as given: the caller passes 0 for the tensors the CPU path
// does not decay (biases, layernorm parameters). grad_scale (1 for none) folds gradient
// clipping or loss scaling into the update. t >= 1 is the 1-based step; the bias corrections
// are computed on the host in double, as on the CPU.
void adamw_update(float* master, bf16* params, const bf16* grads, float* m, float* v, long n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_ADAMW_H_
