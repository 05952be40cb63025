// Device-side helpers shared by the kernels in kernels/cuda/*.cu: bf16 vector loads and stores,
// and warp and block reductions. Include from .cu files only.
//
// Reductions are deterministic: a fixed shuffle tree within a warp, then warp results added in
// warp order; every thread of the warp (or block) gets the same bits.
#ifndef LOOM_KERNELS_CUDA_COMMON_CUH_
#define LOOM_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/types.h"

namespace loom::kernels::cuda::device {

// 8 bf16 = 16 bytes, loaded and stored as one vector instruction.
struct alignas(16) Pack8 {
  bf16 v[8];
};

// x[0..W) = p[0..W) widened to fp32. W is 8 (p must be 16-byte aligned) or 1.
template <int W>
__device__ __forceinline__ void LoadF(const bf16* p, float (&x)[W]) {
  static_assert(W == 8 || W == 1, "vector width is 8 or 1");
  if constexpr (W == 8) {
    const Pack8 pack = *reinterpret_cast<const Pack8*>(p);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = __bfloat162float(pack.v[k]);
  } else {
    x[0] = __bfloat162float(p[0]);
  }
}

// p[0..W) = x[0..W) rounded to bf16 (round to nearest even). Same W rules as LoadF.
template <int W>
__device__ __forceinline__ void StoreF(bf16* p, const float (&x)[W]) {
  static_assert(W == 8 || W == 1, "vector width is 8 or 1");
  if constexpr (W == 8) {
    Pack8 pack;
#pragma unroll
    for (int k = 0; k < 8; ++k) pack.v[k] = __float2bfloat16(x[k]);
    *reinterpret_cast<Pack8*>(p) = pack;
  } else {
    p[0] = __float2bfloat16(x[0]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum (kMax false) or max (kMax true) of v over the block; every thread gets the result.
// Must be called by every thread of the block; blockDim.x a multiple of 32 (at most 1024).
// red is a __shared__ float[32] of the caller, reusable across calls (the leading barrier
// keeps a previous call's readers from seeing this call's writes).
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float v, float* red) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = kMax ? WarpMax(v) : WarpSum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < warps ? red[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? WarpMax(r) : WarpSum(r);
}

// Global thread index and grid-stride of a 1-D launch, in 64 bits.
__device__ __forceinline__ long GlobalThread() {
  return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long GridStride() { return static_cast<long>(gridDim.x) * blockDim.x; }

}  // namespace loom::kernels::cuda::device

#endif  // LOOM_KERNELS_CUDA_COMMON_CUH_
