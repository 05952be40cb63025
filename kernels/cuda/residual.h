// Residual connection on bf16 device buffers. CPU contract: kernels/residual.h.
// Conventions (device pointers, stream order, forward overwrites, backward accumulates):
// kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_RESIDUAL_H_
#define LOOM_KERNELS_CUDA_RESIDUAL_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (n) = a (n) + b (n), summed in fp32 and rounded once. out may alias a or b.
void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream);

// da (n) += dout; db (n) += dout. Accumulates. da and db must not alias.
void residual_backward(bf16* da, bf16* db, const bf16* dout, long n, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_RESIDUAL_H_
