// GELU, tanh approximation, in fp32 on bf16 storage. Contract: kernels/cuda/gelu.h.
// Grid-stride over 16-byte vectors when every pointer is aligned, with a scalar tail.
#include "kernels/cuda/gelu.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubic = 0.044715f;

__device__ __forceinline__ float Gelu(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx.
__device__ __forceinline__ float GeluGrad(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float th = tanhf(u);
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

template <int W>
__global__ void GeluForwardKernel(bf16* out, const bf16* inp, long n) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float x[W];
    device::LoadF<W>(inp + g * W, x);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = Gelu(x[k]);
    device::StoreF<W>(out + g * W, x);
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    out[i] = __float2bfloat16(Gelu(__bfloat162float(inp[i])));
  }
}

template <int W>
__global__ void GeluBackwardKernel(bf16* dinp, const bf16* inp, const bf16* dout, long n) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float x[W], d[W], acc[W];
    device::LoadF<W>(inp + g * W, x);
    device::LoadF<W>(dout + g * W, d);
    device::LoadF<W>(dinp + g * W, acc);
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] += GeluGrad(x[k]) * d[k];
    device::StoreF<W>(dinp + g * W, acc);
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    const float grad = GeluGrad(__bfloat162float(inp[i])) * __bfloat162float(dout[i]);
    dinp[i] = __float2bfloat16(__bfloat162float(dinp[i]) + grad);
  }
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && inp, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  if (launch::AllAligned16({out, inp})) {
    GeluForwardKernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            out, inp, n);
  } else {
    GeluForwardKernel<1>
        <<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(out, inp, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dinp && inp && dout, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  LOOM_KERNEL_CHECK(dinp != inp, "dinp must not alias inp");
  if (launch::AllAligned16({dinp, inp, dout})) {
    GeluBackwardKernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            dinp, inp, dout, n);
  } else {
    GeluBackwardKernel<1>
        <<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(dinp, inp, dout, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
