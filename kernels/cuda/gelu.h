// GELU (tanh approximation, as kernels/gelu.h) on bf16 device buffers.
// Conventions (device pointers, stream order, forward overwrites, backward accumulates):
// kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_GELU_H_
#define LOOM_KERNELS_CUDA_GELU_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (n) = gelu(inp (n)), computed in fp32. out may alias inp.
void gelu_forward(bf16* out, const bf16* inp, long n, cudaStream_t stream);

// dinp (n) += gelu'(inp) * dout. inp, dout (n). Accumulates. dinp may alias dout (each element
// is read before it is written) but not inp.
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, long n, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_GELU_H_
