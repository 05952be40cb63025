// Layernorm forward, fused residual + layernorm forward, and backward.
// Contract: kernels/cuda/layernorm.h.
//
// Forward: one warp per row (kBlock / 32 rows per block); lane l handles the W-wide groups
// l, l + 32, ... of the row (W = 8 with 16-byte vectors when rows are aligned, else 1). Three
// passes over the row (sum, squared deviations, normalise), the later two hitting L1/L2.
// Backward: (1) one warp per row for dinp; (2) partial sums of the weight and bias gradients
// per chunk of kColumnSumRows rows, one thread per channel; (3) one thread per channel adds the
// chunk partials in chunk order. No atomics: deterministic.
#include "kernels/cuda/layernorm.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/layernorm.h"

namespace loom::kernels::cuda {
namespace {

// kResidual: src = a + b (rounded to bf16) is first written to residual and normalised from
// there; otherwise src = a.
template <int W, bool kResidual>
__global__ void LayerNormForwardKernel(bf16* out, float* mean, float* rstd, bf16* residual,
                                       const bf16* a, const bf16* b, const bf16* weight,
                                       const bf16* bias, int N, int C) {
  const long row = static_cast<long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps only; no block-level barrier below
  const int groups = C / W;
  const bf16* src = (kResidual ? residual : a) + row * C;  // (C)
  float sum = 0.0f;
  for (int g = lane; g < groups; g += 32) {
    float v[W];
    device::LoadF<W>(a + row * C + g * W, v);
    if constexpr (kResidual) {
      float u[W];
      device::LoadF<W>(b + row * C + g * W, u);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = __bfloat162float(__float2bfloat16(v[k] + u[k]));
      device::StoreF<W>(residual + row * C + g * W, v);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) sum += v[k];
  }
  const float m = device::WarpSum(sum) / C;
  float sq = 0.0f;
  for (int g = lane; g < groups; g += 32) {
    float v[W];
    device::LoadF<W>(src + g * W, v);  // this lane's own writes above: visible to it
#pragma unroll
    for (int k = 0; k < W; ++k) sq += (v[k] - m) * (v[k] - m);
  }
  const float s = 1.0f / sqrtf(device::WarpSum(sq) / C + kLayerNormEps);
  for (int g = lane; g < groups; g += 32) {
    float v[W], w[W], bb[W];
    device::LoadF<W>(src + g * W, v);
    device::LoadF<W>(weight + g * W, w);
    device::LoadF<W>(bias + g * W, bb);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * s * w[k] + bb[k];
    device::StoreF<W>(out + row * C + g * W, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx = s (g - mean_c(g) - xhat mean_c(g xhat)), g = dout * weight, xhat = (x - m) s.
template <int W>
__global__ void LayerNormBackwardInputKernel(bf16* dinp, const bf16* dout, const bf16* inp,
                                             const bf16* weight, const float* mean,
                                             const float* rstd, int N, int C) {
  const long row = static_cast<long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const int groups = C / W;
  const float m = mean[row];
  const float s = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int g = lane; g < groups; g += 32) {
    float x[W], dy[W], w[W];
    device::LoadF<W>(inp + row * C + g * W, x);
    device::LoadF<W>(dout + row * C + g * W, dy);
    device::LoadF<W>(weight + g * W, w);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float gk = dy[k] * w[k];
      sum_g += gk;
      sum_gx += gk * (x[k] - m) * s;
    }
  }
  const float mean_g = device::WarpSum(sum_g) / C;
  const float mean_gx = device::WarpSum(sum_gx) / C;
  for (int g = lane; g < groups; g += 32) {
    float x[W], dy[W], w[W], dx[W];
    device::LoadF<W>(inp + row * C + g * W, x);
    device::LoadF<W>(dout + row * C + g * W, dy);
    device::LoadF<W>(weight + g * W, w);
    device::LoadF<W>(dinp + row * C + g * W, dx);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float xhat = (x[k] - m) * s;
      dx[k] += s * (dy[k] * w[k] - mean_g - xhat * mean_gx);
    }
    device::StoreF<W>(dinp + row * C + g * W, dx);
  }
}

// grid (ceil(C / blockDim.x), chunks). partial_w, partial_b (chunks, C).
__global__ void LayerNormBackwardPartialKernel(float* partial_w, float* partial_b, const bf16* dout,
                                               const bf16* inp, const float* mean,
                                               const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int chunk = blockIdx.y;
  const long n0 = static_cast<long>(chunk) * launch::kColumnSumRows;
  const long n1 = min(static_cast<long>(N), n0 + launch::kColumnSumRows);
  float acc_w = 0.0f, acc_b = 0.0f;
  for (long n = n0; n < n1; ++n) {
    const float dy = __bfloat162float(dout[n * C + c]);
    const float x = __bfloat162float(inp[n * C + c]);
    acc_w += dy * (x - mean[n]) * rstd[n];
    acc_b += dy;
  }
  partial_w[static_cast<long>(chunk) * C + c] = acc_w;
  partial_b[static_cast<long>(chunk) * C + c] = acc_b;
}

__global__ void LayerNormBackwardFinalKernel(bf16* dweight, bf16* dbias, const float* partial_w,
                                             const float* partial_b, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc_w = 0.0f, acc_b = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    acc_w += partial_w[static_cast<long>(k) * C + c];
    acc_b += partial_b[static_cast<long>(k) * C + c];
  }
  dweight[c] = __float2bfloat16(__bfloat162float(dweight[c]) + acc_w);
  dbias[c] = __float2bfloat16(__bfloat162float(dbias[c]) + acc_b);
}

template <bool kResidual>
void LaunchForward(bf16* out, float* mean, float* rstd, bf16* residual, const bf16* a,
                   const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                   cudaStream_t stream) {
  const int blocks = launch::WarpRowBlocks(N, launch::kBlock);
  if (launch::RowPackWidth(C, {out, residual, a, b, weight, bias}) == launch::kPack) {
    LayerNormForwardKernel<launch::kPack, kResidual><<<blocks, launch::kBlock, 0, stream>>>(
        out, mean, rstd, residual, a, b, weight, bias, N, C);
  } else {
    LayerNormForwardKernel<1, kResidual><<<blocks, launch::kBlock, 0, stream>>>(
        out, mean, rstd, residual, a, b, weight, bias, N, C);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                       const bf16* bias, int N, int C, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && mean && rstd && inp && weight && bias, "null buffer");
  LOOM_KERNEL_CHECK(N > 0 && C > 0, "N and C must be positive");
  LaunchForward<false>(out, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C, stream);
}

void residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                cudaStream_t stream) {
  LOOM_KERNEL_CHECK(residual && out && mean && rstd && a && b && weight && bias, "null buffer");
  LOOM_KERNEL_CHECK(N > 0 && C > 0, "N and C must be positive");
  LOOM_KERNEL_CHECK(out != residual && out != a && out != b, "out must not alias the inputs");
  LaunchForward<true>(out, mean, rstd, residual, a, b, weight, bias, N, C, stream);
}

void layernorm_backward(bf16* dinp, bf16* dweight, bf16* dbias, float* scratch, const bf16* dout,
                        const bf16* inp, const bf16* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dinp && dweight && dbias && scratch && dout && inp && weight && mean && rstd,
                    "null buffer");
  LOOM_KERNEL_CHECK(N > 0 && C > 0, "N and C must be positive");
  const int blocks = launch::WarpRowBlocks(N, launch::kBlock);
  if (launch::RowPackWidth(C, {dinp, dout, inp, weight}) == launch::kPack) {
    LayerNormBackwardInputKernel<launch::kPack>
        <<<blocks, launch::kBlock, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  } else {
    LayerNormBackwardInputKernel<1>
        <<<blocks, launch::kBlock, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  LOOM_CUDA_CHECK_LAUNCH();
  const long chunks = launch::CeilDiv(N, launch::kColumnSumRows);
  LOOM_KERNEL_CHECK(chunks <= 65535, "N too large for the grid.y of the column reduction");
  float* partial_w = scratch;               // (chunks, C)
  float* partial_b = scratch + chunks * C;  // (chunks, C)
  const int column_blocks = static_cast<int>(launch::CeilDiv(C, launch::kBlock));
  const dim3 grid(column_blocks, static_cast<unsigned>(chunks));
  LayerNormBackwardPartialKernel<<<grid, launch::kBlock, 0, stream>>>(partial_w, partial_b, dout,
                                                                      inp, mean, rstd, N, C);
  LOOM_CUDA_CHECK_LAUNCH();
  LayerNormBackwardFinalKernel<<<column_blocks, launch::kBlock, 0, stream>>>(
      dweight, dbias, partial_w, partial_b, static_cast<int>(chunks), C);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
