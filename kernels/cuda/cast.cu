// fp32 <-> bf16 casts. Contract: kernels/cuda/cast.h.
// Grid-stride over kPack-element groups (16-byte bf16 vectors) when every pointer is aligned,
// with a scalar tail; one element per step otherwise.
#include "kernels/cuda/cast.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

template <int W>
__global__ void CastF32ToBf16Kernel(bf16* out, const float* inp, long n) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float x[W];
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = inp[g * W + k];
    device::StoreF<W>(out + g * W, x);
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    out[i] = __float2bfloat16(inp[i]);
  }
}

template <int W>
__global__ void CastBf16ToF32Kernel(float* out, const bf16* inp, long n) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float x[W];
    device::LoadF<W>(inp + g * W, x);
#pragma unroll
    for (int k = 0; k < W; ++k) out[g * W + k] = x[k];
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    out[i] = __bfloat162float(inp[i]);
  }
}

}  // namespace

void cast_f32_to_bf16(bf16* out, const float* inp, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && inp, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  if (launch::AllAligned16({out, inp})) {
    CastF32ToBf16Kernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            out, inp, n);
  } else {
    CastF32ToBf16Kernel<1>
        <<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(out, inp, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void cast_bf16_to_f32(float* out, const bf16* inp, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && inp, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  if (launch::AllAligned16({out, inp})) {
    CastBf16ToF32Kernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            out, inp, n);
  } else {
    CastBf16ToF32Kernel<1>
        <<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(out, inp, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
