// Fused softmax + cross-entropy. Contract: kernels/cuda/crossentropy.h.
//
// Forward: one block of kCrossEntropyThreads per row; a block max, then a block sum of
// exp(z - max) (fp32; each thread adds ~50 terms, then a fixed tree), loss = lse - z[target].
// Two reads of the row (the second from L2), no writes but two floats.
// Backward: elementwise, grid (N rows, column blocks); each thread owns kPack consecutive
// columns (one 16-byte vector when rows are aligned and all kPack columns are valid).
#include "kernels/cuda/crossentropy.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

template <int W>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const bf16* logits,
                                          const int* targets, int V, int Vp) {
  __shared__ float red[32];
  const long n = blockIdx.x;
  const bf16* z = logits + n * Vp;  // (V) valid of (Vp)
  const int groups = V / W;
  float maxv = -INFINITY;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float x[W];
    device::LoadF<W>(z + g * W, x);
#pragma unroll
    for (int k = 0; k < W; ++k) maxv = fmaxf(maxv, x[k]);
  }
  for (int j = groups * W + threadIdx.x; j < V; j += blockDim.x) {
    maxv = fmaxf(maxv, __bfloat162float(z[j]));
  }
  maxv = device::BlockReduce<true>(maxv, red);
  float sum = 0.0f;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float x[W];
    device::LoadF<W>(z + g * W, x);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += expf(x[k] - maxv);
  }
  for (int j = groups * W + threadIdx.x; j < V; j += blockDim.x) {
    sum += expf(__bfloat162float(z[j]) - maxv);
  }
  sum = device::BlockReduce<false>(sum, red);
  if (threadIdx.x == 0) {
    const float row_lse = maxv + logf(sum);
    const int target = targets[n];
    lse[n] = row_lse;
    losses[n] = (target >= 0 && target < V) ? row_lse - __bfloat162float(z[target]) : NAN;
  }
}

template <bool kVector>
__global__ void CrossEntropyBackwardKernel(bf16* dlogits, const bf16* logits, const float* lse,
                                           const int* targets, const float* dlosses, int V,
                                           int Vp) {
  const long n = blockIdx.x;
  const long j0 = (static_cast<long>(blockIdx.y) * blockDim.x + threadIdx.x) * launch::kPack;
  if (j0 >= V) return;
  const float row_lse = lse[n];
  const float dl = dlosses[n];
  const long target = targets[n];
  const bf16* z = logits + n * Vp;  // (Vp)
  bf16* dz = dlogits + n * Vp;      // (Vp)
  if (kVector && j0 + launch::kPack <= V) {
    float x[launch::kPack], d[launch::kPack];
    device::LoadF<launch::kPack>(z + j0, x);
    device::LoadF<launch::kPack>(dz + j0, d);
#pragma unroll
    for (int k = 0; k < launch::kPack; ++k) {
      const float onehot = (j0 + k == target) ? 1.0f : 0.0f;
      d[k] += (expf(x[k] - row_lse) - onehot) * dl;
    }
    device::StoreF<launch::kPack>(dz + j0, d);
  } else {
    const long j1 = min(j0 + launch::kPack, static_cast<long>(V));
    for (long j = j0; j < j1; ++j) {
      const float onehot = (j == target) ? 1.0f : 0.0f;
      const float p = expf(__bfloat162float(z[j]) - row_lse);
      dz[j] = __float2bfloat16(__bfloat162float(dz[j]) + (p - onehot) * dl);
    }
  }
}

void CheckArgs(int N, int V, int Vp) {
  LOOM_KERNEL_CHECK(N > 0 && V > 0, "N and V must be positive");
  LOOM_KERNEL_CHECK(Vp >= V, "the padded row length Vp must be at least V");
}

}  // namespace

void softmax_crossentropy_forward(float* losses, float* lse, const bf16* logits, const int* targets,
                                  int N, int V, int Vp, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(losses && lse && logits && targets, "null buffer");
  CheckArgs(N, V, Vp);
  if (launch::RowPackWidth(Vp, {logits}) == launch::kPack) {
    CrossEntropyForwardKernel<launch::kPack>
        <<<N, launch::kCrossEntropyThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
  } else {
    CrossEntropyForwardKernel<1>
        <<<N, launch::kCrossEntropyThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void softmax_crossentropy_backward(bf16* dlogits, const bf16* logits, const float* lse,
                                   const int* targets, const float* dlosses, int N, int V, int Vp,
                                   cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dlogits && logits && lse && targets && dlosses, "null buffer");
  LOOM_KERNEL_CHECK(dlogits != logits, "dlogits must not alias logits");
  CheckArgs(N, V, Vp);
  const dim3 grid(N, launch::CrossEntropyColumnBlocks(V));
  if (launch::RowPackWidth(Vp, {dlogits, logits}) == launch::kPack) {
    CrossEntropyBackwardKernel<true>
        <<<grid, launch::kBlock, 0, stream>>>(dlogits, logits, lse, targets, dlosses, V, Vp);
  } else {
    CrossEntropyBackwardKernel<false>
        <<<grid, launch::kBlock, 0, stream>>>(dlogits, logits, lse, targets, dlosses, V, Vp);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
