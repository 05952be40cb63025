// Sum of squares of a bf16 tensor on device, for the global gradient norm.
// CPU contract: kernels/grad_norm.h. Conventions: kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_GRAD_NORM_H_
#define LOOM_KERNELS_CUDA_GRAD_NORM_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out[0] (device fp32) = sum_i x[i]^2 over x (n), accumulated in fp32. Overwrites out[0].
// partials: launch::kGradNormBlocks device floats, overwritten. Deterministic: two passes over
// a fixed grid (independent of the device), no atomics. The caller sums over tensors (and
// ranks) and takes the square root; a single contiguous gradient buffer needs one call.
void sum_of_squares(float* out, float* partials, const bf16* x, long n, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_GRAD_NORM_H_
