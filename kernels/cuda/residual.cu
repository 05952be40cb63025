// Residual add. Contract: kernels/cuda/residual.h.
// Grid-stride over 16-byte vectors when every pointer is aligned, with a scalar tail.
#include "kernels/cuda/residual.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

template <int W>
__global__ void ResidualForwardKernel(bf16* out, const bf16* a, const bf16* b, long n) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float x[W], y[W];
    device::LoadF<W>(a + g * W, x);
    device::LoadF<W>(b + g * W, y);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] += y[k];
    device::StoreF<W>(out + g * W, x);
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
  }
}

template <int W>
__global__ void ResidualBackwardKernel(bf16* da, bf16* db, const bf16* dout, long n) {
  const long groups = n / W;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float d[W], x[W], y[W];
    device::LoadF<W>(dout + g * W, d);
    device::LoadF<W>(da + g * W, x);
    device::LoadF<W>(db + g * W, y);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      x[k] += d[k];
      y[k] += d[k];
    }
    device::StoreF<W>(da + g * W, x);
    device::StoreF<W>(db + g * W, y);
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    const float d = __bfloat162float(dout[i]);
    da[i] = __float2bfloat16(__bfloat162float(da[i]) + d);
    db[i] = __float2bfloat16(__bfloat162float(db[i]) + d);
  }
}

}  // namespace

void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && a && b, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  if (launch::AllAligned16({out, a, b})) {
    ResidualForwardKernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            out, a, b, n);
  } else {
    ResidualForwardKernel<1>
        <<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(out, a, b, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void residual_backward(bf16* da, bf16* db, const bf16* dout, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(da && db && dout, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  LOOM_KERNEL_CHECK(da != db, "da and db must not alias");
  if (launch::AllAligned16({da, db, dout})) {
    ResidualBackwardKernel<launch::kPack>
        <<<launch::GridBlocks(n / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            da, db, dout, n);
  } else {
    ResidualBackwardKernel<1>
        <<<launch::GridBlocks(n, launch::kBlock), launch::kBlock, 0, stream>>>(da, db, dout, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
