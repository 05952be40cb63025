// Sum of squares, deterministic two-pass reduction. Contract: kernels/cuda/grad_norm.h.
// Pass 1: kGradNormBlocks blocks of kGradNormThreads threads grid-stride over x (16-byte vectors
// when aligned, scalar tail), each thread summing its elements in order, then a fixed block tree;
// block k writes partials[k]. Pass 2: one block of kGradNormBlocks threads adds the partials
// with the same fixed tree. Which thread sums which element depends only on n.
#include "kernels/cuda/grad_norm.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

static_assert(launch::kGradNormBlocks <= 1024, "pass 2 runs one thread per partial");

template <int W>
__global__ void SumSquaresPartialKernel(float* partials, const bf16* x, long n) {
  __shared__ float red[32];
  const long groups = n / W;
  float acc = 0.0f;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    float v[W];
    device::LoadF<W>(x + g * W, v);
#pragma unroll
    for (int k = 0; k < W; ++k) acc += v[k] * v[k];
  }
  for (long i = groups * W + device::GlobalThread(); i < n; i += device::GridStride()) {
    const float v = __bfloat162float(x[i]);
    acc += v * v;
  }
  acc = device::BlockReduce<false>(acc, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void SumSquaresFinalKernel(float* out, const float* partials) {
  __shared__ float red[32];
  const float total = device::BlockReduce<false>(partials[threadIdx.x], red);
  if (threadIdx.x == 0) out[0] = total;
}

}  // namespace

void sum_of_squares(float* out, float* partials, const bf16* x, long n, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && partials && x, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  if (launch::AllAligned16({x})) {
    SumSquaresPartialKernel<launch::kPack>
        <<<launch::kGradNormBlocks, launch::kGradNormThreads, 0, stream>>>(partials, x, n);
  } else {
    SumSquaresPartialKernel<1>
        <<<launch::kGradNormBlocks, launch::kGradNormThreads, 0, stream>>>(partials, x, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
  SumSquaresFinalKernel<<<1, launch::kGradNormBlocks, 0, stream>>>(out, partials);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
