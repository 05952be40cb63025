// Fused causal self-attention. Contract: kernels/cuda/flash_attention.h.
//
// Three kernels, one head of one batch element per blockIdx.y, four warps per block, each warp
// owning 16 rows of the block's tile (launch.h: kFlashQueryRows = 64 rows per block, tiles of
// kFlashKeyCols = 32 along the other dimension). Tiles of q, k, v and dout are copied to shared
// memory (rows past T as zeros); every product is a 16x16x16 bf16 tensor-core MMA with fp32
// accumulation; the row-wise softmax work is done by two lanes per row (16 columns each,
// combined by one shuffle). With scale = 1/sqrt(HS) and, for query t and key j <= t,
// s = scale * q_t . k_j:
//
//   forward (per query block, over key tiles j <= the block's last query):
//     S = Q K^T; m' = max(m, rowmax S); P = exp(S - m'); l = l e^(m - m') + rowsum P;
//     O = O e^(m - m') + P V;  at the end out = O / l, lse = m + log l
//   backward, with D_t = sum_c dout[t, c] out[t, c] (FlashDKernel) and P = exp(S - lse):
//     dP = dO V^T; dS = P (dP - D) scale
//     dK/dV kernel (per key block, over query tiles t >= the block's first key):
//       dV += P^T dO, dK += dS^T Q
//     dQ kernel (per query block, over key tiles as the forward): dQ += dS K
//
// Shared memory per block at HS = 64: about 45 KiB (forward), 40 KiB (each backward kernel).
#include "kernels/cuda/flash_attention.h"

#include <mma.h>

#include <cmath>

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using launch::kFlashKeyCols;
using launch::kFlashQueryRows;
using launch::kFlashThreads;

constexpr int kWarps = kFlashThreads / 32;
static_assert(kWarps * 16 == kFlashQueryRows, "each warp owns 16 rows of a block's tile");
static_assert(kFlashKeyCols == 32, "two lanes per row, 16 columns each");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst (rows, HS) = rows [row0, row0 + rows) of one head's q, k or v (or dout): src points at
// that head's first channel of row 0, rows `stride` elements apart; rows at or past T are zero.
// Called by every thread of the block.
template <int HS>
__device__ void LoadRows(bf16* dst, int rows, const bf16* src, long stride, int row0, int T) {
  for (int i = threadIdx.x; i < rows * HS; i += blockDim.x) {
    const int r = i / HS, c = i % HS;
    dst[i] = row0 + r < T ? src[static_cast<long>(row0 + r) * stride + c] : __float2bfloat16(0.0f);
  }
}

// out (16, 16 * NT) fp32 row-major (ld ldo) = a (16, K) . b^T, with a row-major (ld lda) and b
// (16 * NT, K) row-major (ld ldb): scores from q and k rows. One warp.
template <int K, int NT>
__device__ void MulTransposed(float* out, int ldo, const bf16* a, int lda, const bf16* b, int ldb) {
  for (int n = 0; n < NT; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K / 16; ++k) {
      FragA fa;
      FragBt fb;
      wmma::load_matrix_sync(fa, a + k * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + k * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, ldo, wmma::mem_row_major);
  }
}

// acc[n] += a (16, K) . b (K, 16 * NF) for n < NF, a and b row-major (ld lda, ldb). One warp.
template <int K, int NF>
__device__ void MulAdd(FragC (&acc)[NF], const bf16* a, int lda, const bf16* b, int ldb) {
  for (int n = 0; n < NF; ++n) {
    for (int k = 0; k < K / 16; ++k) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, a + k * 16, lda);
      wmma::load_matrix_sync(fb, b + k * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// dst rows [row0, row0 + 16) of one head's part of dqkv (row stride 3C) += acc (16, HS), through
// the warp's 16x16 fp32 staging tile. One warp.
template <int HS>
__device__ void AddRows(bf16* dst, long stride, int row0, int T, FragC (&acc)[HS / 16],
                        float* stage) {
  const int lane = threadIdx.x % 32;
  for (int n = 0; n < HS / 16; ++n) {
    wmma::store_matrix_sync(stage, acc[n], 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
      const int r = i / 16, c = i % 16;
      if (row0 + r < T) {
        bf16* p = dst + static_cast<long>(row0 + r) * stride + n * 16 + c;
        *p = __float2bfloat16(__bfloat162float(*p) + stage[i]);
      }
    }
    __syncwarp();
  }
}

// grid (ceil(T / kFlashQueryRows), B * NH), kFlashThreads threads.
template <int HS>
__global__ void FlashForwardKernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH,
                                   float scale) {
  constexpr int R = kFlashQueryRows, K = kFlashKeyCols;
  alignas(32) __shared__ bf16 q_s[R * HS];   // (R, HS)
  alignas(32) __shared__ bf16 k_s[K * HS];   // (K, HS)
  alignas(32) __shared__ bf16 v_s[K * HS];   // (K, HS)
  alignas(32) __shared__ bf16 p_s[R * K];    // (R, K) probabilities of the tile
  alignas(32) __shared__ float s_s[R * K];   // (R, K) scores of the tile
  alignas(32) __shared__ float o_s[R * HS];  // (R, HS) unnormalised output
  __shared__ float m_s[R], l_s[R];           // running row maximum and sum

  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = blockIdx.x * R;
  const long stride = 3L * C;
  const bf16* base = qkv + static_cast<long>(b) * T * stride + h * HS;  // (T, 3C) at head h
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 2;  // this lane's row of the block, with its pair lane
  const int half = lane % 2;             // which 16 columns (of K) or HS / 2 channels
  const int t = q0 + row;                // its query

  LoadRows<HS>(q_s, R, base, stride, q0, T);
  for (int i = threadIdx.x; i < R * HS; i += blockDim.x) o_s[i] = 0.0f;
  for (int i = threadIdx.x; i < R; i += blockDim.x) {
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }
  const int last = min(q0 + R, T) - 1;  // the block's last query: later keys are all masked
  for (int k0 = 0; k0 <= last; k0 += K) {
    __syncthreads();  // the previous tile's readers are done (and q_s, o_s are written)
    LoadRows<HS>(k_s, K, base + C, stride, k0, T);
    LoadRows<HS>(v_s, K, base + 2 * C, stride, k0, T);
    __syncthreads();
    float* s_w = s_s + warp * 16 * K;  // (16, K) this warp's rows
    bf16* p_w = p_s + warp * 16 * K;
    MulTransposed<HS, K / 16>(s_w, K, q_s + warp * 16 * HS, HS, k_s, HS);
    __syncwarp();
    float s[16];
    float mx = -INFINITY;
    for (int c = 0; c < 16; ++c) {
      const int j = k0 + half * 16 + c;
      s[c] = j <= t && t < T ? s_s[row * K + half * 16 + c] * scale : -INFINITY;
      mx = fmaxf(mx, s[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = m_s[row];
    const float m_new = fmaxf(m_old, mx);
    // A row with nothing unmasked yet (m_new = -inf: only rows past T) keeps O = 0 and l = 0.
    const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
    float sum = 0.0f;
    for (int c = 0; c < 16; ++c) {
      const float p = s[c] == -INFINITY ? 0.0f : expf(s[c] - m_new);
      p_w[(lane / 2) * K + half * 16 + c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) o_s[row * HS + c] *= alpha;
    __syncwarp();  // both lanes of the pair have read m_s[row] and l_s[row]
    if (half == 0) {
      m_s[row] = m_new;
      l_s[row] = l_s[row] * alpha + sum;
    }
    __syncwarp();  // p_w and the rescaled o_s rows are complete
    FragC acc[HS / 16];
    for (int n = 0; n < HS / 16; ++n) {
      wmma::load_matrix_sync(acc[n], o_s + warp * 16 * HS + n * 16, HS, wmma::mem_row_major);
    }
    MulAdd<K, HS / 16>(acc, p_w, K, v_s, HS);
    for (int n = 0; n < HS / 16; ++n) {
      wmma::store_matrix_sync(o_s + warp * 16 * HS + n * 16, acc[n], HS, wmma::mem_row_major);
    }
  }
  __syncwarp();
  if (t >= T) return;
  const float inv = 1.0f / l_s[row];
  bf16* o = out + (static_cast<long>(b) * T + t) * C + h * HS;
  for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) {
    o[c] = __float2bfloat16(o_s[row * HS + c] * inv);
  }
  if (half == 0) lse[(static_cast<long>(b) * NH + h) * T + t] = m_s[row] + logf(l_s[row]);
}

// d[(b, h, t)] = sum over the head's channels of dout * out: one warp per (b, t, h) row.
template <int HS>
__global__ void FlashDKernel(float* d, const bf16* dout, const bf16* out, int B, int T, int C,
                             int NH) {
  const long r = static_cast<long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= static_cast<long>(B) * T * NH) return;
  const long bt = r / NH;
  const int h = static_cast<int>(r % NH);
  const long at = bt * C + h * HS;
  float sum = 0.0f;
  for (int c = lane; c < HS; c += 32)
    sum += __bfloat162float(dout[at + c]) * __bfloat162float(out[at + c]);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const long b = bt / T, t = bt % T;
  if (lane == 0) d[(b * NH + h) * T + t] = sum;
}

// grid (ceil(T / kFlashQueryRows), B * NH): blockIdx.x's block of kFlashQueryRows keys, over
// tiles of kFlashKeyCols queries from its first key on (earlier queries cannot see its keys).
template <int HS>
__global__ void FlashBackwardKvKernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                      const float* lse, const float* dsum, int T, int C, int NH,
                                      float scale) {
  constexpr int R = kFlashQueryRows, Q = kFlashKeyCols;
  alignas(32) __shared__ bf16 k_s[R * HS];   // (R, HS) the block's keys
  alignas(32) __shared__ bf16 v_s[R * HS];   // (R, HS) and values
  alignas(32) __shared__ bf16 q_s[Q * HS];   // (Q, HS) the tile's queries
  alignas(32) __shared__ bf16 do_s[Q * HS];  // (Q, HS) and output gradients
  alignas(32) __shared__ float s_s[R * Q];   // (R, Q) S^T, then dP^T
  alignas(32) __shared__ bf16 p_s[R * Q];    // (R, Q) P^T
  alignas(32) __shared__ bf16 ds_s[R * Q];   // (R, Q) dS^T
  __shared__ float lse_s[Q], d_s[Q];

  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int k0 = blockIdx.x * R;
  const long stride = 3L * C;
  const long row_base = static_cast<long>(b) * T * stride + h * HS;
  const bf16* base = qkv + row_base;
  const bf16* dbase = dout + static_cast<long>(b) * T * C + h * HS;
  const float* lse_bh = lse + static_cast<long>(blockIdx.y) * T;
  const float* d_bh = dsum + static_cast<long>(blockIdx.y) * T;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key = k0 + warp * 16 + lane / 2;  // this lane's key row, with its pair lane
  const int half = lane % 2;
  float* s_w = s_s + warp * 16 * Q;
  bf16* p_w = p_s + warp * 16 * Q;
  bf16* ds_w = ds_s + warp * 16 * Q;

  LoadRows<HS>(k_s, R, base + C, stride, k0, T);
  LoadRows<HS>(v_s, R, base + 2 * C, stride, k0, T);
  FragC dk[HS / 16], dv[HS / 16];
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int q0 = k0; q0 < T; q0 += Q) {
    __syncthreads();  // the previous tile's readers are done (and k_s, v_s are written)
    LoadRows<HS>(q_s, Q, base, stride, q0, T);
    LoadRows<HS>(do_s, Q, dbase, C, q0, T);
    for (int i = threadIdx.x; i < Q; i += blockDim.x) {
      lse_s[i] = q0 + i < T ? lse_bh[q0 + i] : 0.0f;
      d_s[i] = q0 + i < T ? d_bh[q0 + i] : 0.0f;
    }
    __syncthreads();
    MulTransposed<HS, Q / 16>(s_w, Q, k_s + warp * 16 * HS, HS, q_s, HS);  // S^T (16, Q)
    __syncwarp();
    const int r = (lane / 2) * Q;
    for (int c = half * 16; c < half * 16 + 16; ++c) {
      const int tq = q0 + c;
      const float p = key <= tq && tq < T && key < T ? expf(s_w[r + c] * scale - lse_s[c]) : 0.0f;
      p_w[r + c] = __float2bfloat16(p);
    }
    __syncwarp();
    MulAdd<Q, HS / 16>(dv, p_w, Q, do_s, HS);
    MulTransposed<HS, Q / 16>(s_w, Q, v_s + warp * 16 * HS, HS, do_s, HS);  // dP^T (16, Q)
    __syncwarp();
    for (int c = half * 16; c < half * 16 + 16; ++c) {
      const float p = __bfloat162float(p_w[r + c]);
      ds_w[r + c] = __float2bfloat16(p * (s_w[r + c] - d_s[c]) * scale);
    }
    __syncwarp();
    MulAdd<Q, HS / 16>(dk, ds_w, Q, q_s, HS);
  }
  __syncwarp();  // s_w is free: stage the results through it
  bf16* dbase_qkv = dqkv + row_base;
  AddRows<HS>(dbase_qkv + C, stride, k0 + warp * 16, T, dk, s_w);
  AddRows<HS>(dbase_qkv + 2 * C, stride, k0 + warp * 16, T, dv, s_w);
}

// grid (ceil(T / kFlashQueryRows), B * NH): blockIdx.x's block of queries over key tiles, as the
// forward.
template <int HS>
__global__ void FlashBackwardQKernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                     const float* lse, const float* dsum, int T, int C, int NH,
                                     float scale) {
  constexpr int R = kFlashQueryRows, K = kFlashKeyCols;
  alignas(32) __shared__ bf16 q_s[R * HS];   // (R, HS) the block's queries
  alignas(32) __shared__ bf16 do_s[R * HS];  // (R, HS) and output gradients
  alignas(32) __shared__ bf16 k_s[K * HS];   // (K, HS) the tile's keys
  alignas(32) __shared__ bf16 v_s[K * HS];   // (K, HS) and values
  alignas(32) __shared__ float s_s[R * K];   // (R, K) S, then dP
  alignas(32) __shared__ bf16 p_s[R * K];    // (R, K) P
  alignas(32) __shared__ bf16 ds_s[R * K];   // (R, K) dS
  __shared__ float lse_s[R], d_s[R];

  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = blockIdx.x * R;
  const long stride = 3L * C;
  const long row_base = static_cast<long>(b) * T * stride + h * HS;
  const bf16* base = qkv + row_base;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 2;
  const int half = lane % 2;
  const int t = q0 + row;
  float* s_w = s_s + warp * 16 * K;
  bf16* p_w = p_s + warp * 16 * K;
  bf16* ds_w = ds_s + warp * 16 * K;

  LoadRows<HS>(q_s, R, base, stride, q0, T);
  LoadRows<HS>(do_s, R, dout + static_cast<long>(b) * T * C + h * HS, C, q0, T);
  for (int i = threadIdx.x; i < R; i += blockDim.x) {
    const long at = static_cast<long>(blockIdx.y) * T + q0 + i;
    lse_s[i] = q0 + i < T ? lse[at] : 0.0f;
    d_s[i] = q0 + i < T ? dsum[at] : 0.0f;
  }
  FragC dq[HS / 16];
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int last = min(q0 + R, T) - 1;
  for (int k0 = 0; k0 <= last; k0 += K) {
    __syncthreads();
    LoadRows<HS>(k_s, K, base + C, stride, k0, T);
    LoadRows<HS>(v_s, K, base + 2 * C, stride, k0, T);
    __syncthreads();
    MulTransposed<HS, K / 16>(s_w, K, q_s + warp * 16 * HS, HS, k_s, HS);  // S (16, K)
    __syncwarp();
    const int r = (lane / 2) * K;
    for (int c = half * 16; c < half * 16 + 16; ++c) {
      const int j = k0 + c;
      const float p = j <= t && t < T ? expf(s_w[r + c] * scale - lse_s[row]) : 0.0f;
      p_w[r + c] = __float2bfloat16(p);
    }
    __syncwarp();
    MulTransposed<HS, K / 16>(s_w, K, do_s + warp * 16 * HS, HS, v_s, HS);  // dP (16, K)
    __syncwarp();
    for (int c = half * 16; c < half * 16 + 16; ++c) {
      const float p = __bfloat162float(p_w[r + c]);
      ds_w[r + c] = __float2bfloat16(p * (s_w[r + c] - d_s[row]) * scale);
    }
    __syncwarp();
    MulAdd<K, HS / 16>(dq, ds_w, K, k_s, HS);
  }
  __syncwarp();
  AddRows<HS>(dqkv + row_base, stride, q0 + warp * 16, T, dq, s_w);
}

void CheckArgs(int B, int T, int C, int NH) {
  LOOM_KERNEL_CHECK(B > 0 && T > 0 && C > 0 && NH > 0, "B, T, C and NH must be positive");
  LOOM_KERNEL_CHECK(launch::FlashAttentionSupported(C, NH),
                    "head size C / NH must be a multiple of 16 up to kFlashMaxHeadSize");
  // One block per (batch element, head) along grid.y.
  LOOM_KERNEL_CHECK(static_cast<long>(B) * NH <= 65535, "B * NH above grid.y's 65535");
}

template <int HS>
void Forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, float scale,
             cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(launch::CeilDiv(T, kFlashQueryRows)),
                  static_cast<unsigned>(B * NH));
  FlashForwardKernel<HS><<<grid, kFlashThreads, 0, stream>>>(out, lse, qkv, T, C, NH, scale);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <int HS>
void Backward(bf16* dqkv, float* d, const bf16* dout, const bf16* out, const bf16* qkv,
              const float* lse, int B, int T, int C, int NH, float scale, cudaStream_t stream) {
  const long rows = static_cast<long>(B) * T * NH;
  FlashDKernel<HS><<<launch::WarpRowBlocks(rows, launch::kBlock), launch::kBlock, 0, stream>>>(
      d, dout, out, B, T, C, NH);
  LOOM_CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(launch::CeilDiv(T, kFlashQueryRows)),
                  static_cast<unsigned>(B * NH));
  FlashBackwardKvKernel<HS>
      <<<grid, kFlashThreads, 0, stream>>>(dqkv, dout, qkv, lse, d, T, C, NH, scale);
  LOOM_CUDA_CHECK_LAUNCH();
  FlashBackwardQKernel<HS>
      <<<grid, kFlashThreads, 0, stream>>>(dqkv, dout, qkv, lse, d, T, C, NH, scale);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && lse && qkv, "null buffer");
  CheckArgs(B, T, C, NH);
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  switch (HS) {
    case 16:
      return Forward<16>(out, lse, qkv, B, T, C, NH, scale, stream);
    case 32:
      return Forward<32>(out, lse, qkv, B, T, C, NH, scale, stream);
    case 48:
      return Forward<48>(out, lse, qkv, B, T, C, NH, scale, stream);
    default:
      return Forward<64>(out, lse, qkv, B, T, C, NH, scale, stream);
  }
}

void flash_attention_backward(bf16* dqkv, void* scratch, const bf16* dout, const bf16* out,
                              const bf16* qkv, const float* lse, int B, int T, int C, int NH,
                              cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dqkv && scratch && dout && out && qkv && lse, "null buffer");
  CheckArgs(B, T, C, NH);
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  float* d = static_cast<float*>(scratch);  // (B, NH, T)
  switch (HS) {
    case 16:
      return Backward<16>(dqkv, d, dout, out, qkv, lse, B, T, C, NH, scale, stream);
    case 32:
      return Backward<32>(dqkv, d, dout, out, qkv, lse, B, T, C, NH, scale, stream);
    case 48:
      return Backward<48>(dqkv, d, dout, out, qkv, lse, B, T, C, NH, scale, stream);
    default:
      return Backward<64>(dqkv, d, dout, out, qkv, lse, B, T, C, NH, scale, stream);
  }
}

}  // namespace loom::kernels::cuda
