// fp32 <-> bf16 conversions on device buffers (uploading weights, reading activations back).
// Conventions (device pointers, stream order): see kernels/cuda/README.md.
#ifndef LOOM_KERNELS_CUDA_CAST_H_
#define LOOM_KERNELS_CUDA_CAST_H_

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (n) = bf16(inp (n)), round to nearest even. Enqueued on stream.
void cast_f32_to_bf16(bf16* out, const float* inp, long n, cudaStream_t stream);

// out (n) = float(inp (n)), exact. Enqueued on stream.
void cast_bf16_to_f32(float* out, const bf16* inp, long n, cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_CAST_H_
