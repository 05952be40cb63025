// Token + position embedding. Contract: kernels/cuda/encoder.h.
//
// Forward: one thread per kPack-channel group (or per channel when rows are not 16-byte
// aligned), grid-stride over the N*C/W groups.
// Backward, dwte: a 2-D grid, blockIdx.x = row r (N rows), blockIdx.y = a slice of
// kBlock * kChannelsPerThread channels, kChannelsPerThread per thread. A block first decides
// whether r is the first occurrence of its token (tokens[0..r) scanned by the whole block); if not
// it exits, otherwise each thread walks rows r..N-1 in order, adding dout[j, c] for every j with
// the same token, and adds the fp32 total to dwte[token, c]. Each gradient element has exactly one
// writer and a fixed summation order: deterministic. Token ids are staged through shared memory in
// chunks. Backward, dwpe: one thread per (t, c), summing b = 0..B-1 in order.
#include "kernels/cuda/encoder.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

// Token ids staged in shared memory per step of the backward scan.
constexpr int kTokenChunk = 2048;
// Channels of dwte per thread in the backward: one column of blocks covers C <= 1024 (GPT-2
// small to large), so the token scans run once per row, not once per 256 channels.
constexpr int kChannelsPerThread = 4;

template <int W>
__global__ void EncoderForwardKernel(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe,
                                     long N, int T, int C) {
  const long groups_per_row = C / W;
  const long groups = N * groups_per_row;
  for (long g = device::GlobalThread(); g < groups; g += device::GridStride()) {
    const long r = g / groups_per_row;
    const long c = (g % groups_per_row) * W;
    const long t = r % T;
    float x[W], y[W];
    device::LoadF<W>(wte + static_cast<long>(tokens[r]) * C + c, x);
    device::LoadF<W>(wpe + t * C + c, y);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] += y[k];
    device::StoreF<W>(out + r * C + c, x);
  }
}

// grid (N, ceil(C / (blockDim.x * kChannelsPerThread))); see the file comment. Thread x of
// column block y owns channels y * blockDim.x * K + x + k * blockDim.x for k < K.
__global__ void EncoderBackwardWteKernel(bf16* dwte, const bf16* dout, const int* tokens, int N,
                                         int C) {
  __shared__ int chunk[kTokenChunk];
  const int r = blockIdx.x;
  const int token = tokens[r];
  // Is r the first row with this token? Any earlier match means another block owns it.
  int seen = 0;
  for (int j = threadIdx.x; j < r; j += blockDim.x) seen |= (tokens[j] == token);
  if (__syncthreads_or(seen)) return;  // uniform across the block

  const int c0 = blockIdx.y * blockDim.x * kChannelsPerThread + threadIdx.x;
  float acc[kChannelsPerThread] = {};
  for (int j0 = r; j0 < N; j0 += kTokenChunk) {
    const int len = min(kTokenChunk, N - j0);
    __syncthreads();  // the previous chunk is no longer read
    for (int j = threadIdx.x; j < len; j += blockDim.x) chunk[j] = tokens[j0 + j];
    __syncthreads();
    for (int j = 0; j < len; ++j) {
      if (chunk[j] != token) continue;
      const bf16* row = dout + static_cast<long>(j0 + j) * C;  // (C)
#pragma unroll
      for (int k = 0; k < kChannelsPerThread; ++k) {
        const int c = c0 + k * blockDim.x;
        if (c < C) acc[k] += __bfloat162float(row[c]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kChannelsPerThread; ++k) {
    const int c = c0 + k * blockDim.x;
    if (c < C) {
      bf16* dst = dwte + static_cast<long>(token) * C + c;
      *dst = __float2bfloat16(__bfloat162float(*dst) + acc[k]);
    }
  }
}

__global__ void EncoderBackwardWpeKernel(bf16* dwpe, const bf16* dout, int B, int T, int C) {
  const long items = static_cast<long>(T) * C;
  for (long i = device::GlobalThread(); i < items; i += device::GridStride()) {
    // i = t * C + c; dout[b, t, c] sits at b * T * C + i.
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += __bfloat162float(dout[static_cast<long>(b) * items + i]);
    dwpe[i] = __float2bfloat16(__bfloat162float(dwpe[i]) + acc);
  }
}

void CheckArgs(int B, int T, int C) {
  LOOM_KERNEL_CHECK(B > 0 && T > 0 && C > 0, "B, T and C must be positive");
}

}  // namespace

void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T,
                     int C, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && tokens && wte && wpe, "null buffer");
  CheckArgs(B, T, C);
  const long N = static_cast<long>(B) * T;
  if (launch::RowPackWidth(C, {out, wte, wpe}) == launch::kPack) {
    EncoderForwardKernel<launch::kPack>
        <<<launch::GridBlocks(N * C / launch::kPack, launch::kBlock), launch::kBlock, 0, stream>>>(
            out, tokens, wte, wpe, N, T, C);
  } else {
    EncoderForwardKernel<1>
        <<<launch::GridBlocks(N * C, launch::kBlock), launch::kBlock, 0, stream>>>(out, tokens, wte,
                                                                                   wpe, N, T, C);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void encoder_backward(bf16* dwte, bf16* dwpe, const bf16* dout, const int* tokens, int B, int T,
                      int C, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dwte && dwpe && dout && tokens, "null buffer");
  CheckArgs(B, T, C);
  const long N = static_cast<long>(B) * T;
  LOOM_KERNEL_CHECK(N <= 0x7fffffffL, "B*T must fit the grid");
  const dim3 grid(static_cast<unsigned>(N),
                  static_cast<unsigned>(launch::CeilDiv(C, launch::kBlock * kChannelsPerThread)));
  EncoderBackwardWteKernel<<<grid, launch::kBlock, 0, stream>>>(dwte, dout, tokens,
                                                                static_cast<int>(N), C);
  LOOM_CUDA_CHECK_LAUNCH();
  EncoderBackwardWpeKernel<<<launch::GridBlocks(static_cast<long>(T) * C, launch::kBlock),
                             launch::kBlock, 0, stream>>>(dwpe, dout, B, T, C);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
