// Causal self-attention. Contract: kernels/cuda/attention.h.
//
// No permute kernels: for a fixed batch element b, head h's q, k, v are (T,HS) slices of qkv
// with row stride 3C, at offsets h*HS from one another, so one strided-batched GEMM (batch =
// NH, stride HS) covers all heads of b, and the launchers loop over b (B calls per GEMM).
// Row-major (T,HS) with row stride 3C is column-major (HS,T) with ld 3C; (T,T) row-major
// att/scores are column-major (T,T) transposes. Per b and head, in column-major terms (the exact
// shapes, offsets and strides: gemm_shapes.h):
//   forward   S^T (T,T)    = K (T,HS) . Q^T (HS,T)          -> fp32 scores
//             softmax kernel: att = causal_softmax(S * scale)   -> bf16 att
//             out^T (HS,T) = V^T (HS,T) . att^T (T,T)        -> bf16 out
//   backward  dA^T (T,T)   = V (T,HS) . dy^T (HS,T)          -> fp32 d(att)
//             dV^T (HS,T) += dy^T (HS,T) . att (T,T)
//             softmax backward kernel: dS = scale * att * (dA - rowsum(att * dA)) -> bf16
//             dQ^T (HS,T) += K^T (HS,T) . dS^T (T,T)
//             dK^T (HS,T) += Q^T (HS,T) . dS (T,T)
// The full T x T products are computed (the masked half is then zeroed), as on the CPU.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_shapes.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

// Runs one strided-batched GEMM of gemm_shapes.h on cuBLAS: alpha = 1, fp32 compute, bf16 A
// and B; D is bf16 or fp32 (d_type). a, b, d are the bases the shape's offsets refer to.
void Run(GemmContext& ctx, const launch::GemmShape& g, const bf16* a, const bf16* b, void* d,
         cudaDataType_t d_type, cudaStream_t stream) {
  const float alpha = 1.0f;
  void* d_at = d_type == CUDA_R_32F ? static_cast<void*>(static_cast<float*>(d) + g.d_offset)
                                    : static_cast<void*>(static_cast<bf16*>(d) + g.d_offset);
  LOOM_CUBLAS_CHECK(cublasSetStream(ctx.blas(), stream));
  LOOM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      ctx.blas(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m,
      g.n, g.k, &alpha, a + g.a_offset, CUDA_R_16BF, g.lda, g.stride_a, b + g.b_offset, CUDA_R_16BF,
      g.ldb, g.stride_b, &g.beta, d_at, d_type, g.ldd, g.stride_d, g.batch, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

// One warp per row of (rows = NH*T, T): row r is query t = r % T.
// att[r, j] = softmax_j(scores[r, j] * scale) over j <= t, and 0 for j > t.
__global__ void CausalSoftmaxKernel(bf16* att, const float* scores, int rows, int T, float scale) {
  const long r = static_cast<long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int t = static_cast<int>(r % T);
  const float* s = scores + r * T;  // (T)
  bf16* a = att + r * T;            // (T)
  float maxv = -INFINITY;
  for (int j = lane; j <= t; j += 32) maxv = fmaxf(maxv, s[j] * scale);
  maxv = device::WarpMax(maxv);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += 32) sum += expf(s[j] * scale - maxv);
  const float inv = 1.0f / device::WarpSum(sum);
  for (int j = lane; j < T; j += 32) {
    a[j] = __float2bfloat16(j <= t ? expf(s[j] * scale - maxv) * inv : 0.0f);
  }
}

// One warp per row, as above: ds[r, j] = scale * att[r, j] * (da[r, j] - sum_i att[r, i] da[r, i])
// for j <= t, 0 for j > t.
__global__ void CausalSoftmaxBackwardKernel(bf16* ds, const float* da, const bf16* att, int rows,
                                            int T, float scale) {
  const long r = static_cast<long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int t = static_cast<int>(r % T);
  const float* d = da + r * T;  // (T)
  const bf16* a = att + r * T;  // (T)
  bf16* out = ds + r * T;       // (T)
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += __bfloat162float(a[j]) * d[j];
  dot = device::WarpSum(dot);
  for (int j = lane; j < T; j += 32) {
    out[j] = __float2bfloat16(j <= t ? scale * __bfloat162float(a[j]) * (d[j] - dot) : 0.0f);
  }
}

void CheckArgs(int B, int T, int C, int NH) {
  LOOM_KERNEL_CHECK(B > 0 && T > 0 && C > 0 && NH > 0, "B, T, C and NH must be positive");
  LOOM_KERNEL_CHECK(C % NH == 0, "C must be divisible by NH");
}

}  // namespace

void attention_forward(GemmContext& ctx, bf16* out, bf16* att, void* scratch, const bf16* qkv,
                       int B, int T, int C, int NH, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && att && scratch && qkv, "null buffer");
  CheckArgs(B, T, C, NH);
  const int HS = C / NH;
  const long TT = static_cast<long>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  float* scores = static_cast<float*>(scratch);  // (NH,T,T)
  const int rows = NH * T;
  for (int b = 0; b < B; ++b) {
    bf16* att_b = att + static_cast<long>(b) * NH * TT;  // (NH,T,T)
    Run(ctx, launch::AttentionScoresShape(b, T, C, NH), qkv, qkv, scores, CUDA_R_32F, stream);
    CausalSoftmaxKernel<<<launch::WarpRowBlocks(rows, launch::kBlock), launch::kBlock, 0, stream>>>(
        att_b, scores, rows, T, scale);
    LOOM_CUDA_CHECK_LAUNCH();
    Run(ctx, launch::AttentionOutputShape(b, T, C, NH), qkv, att, out, CUDA_R_16BF, stream);
  }
}

void attention_backward(GemmContext& ctx, bf16* dqkv, void* scratch, const bf16* dout,
                        const bf16* qkv, const bf16* att, int B, int T, int C, int NH,
                        cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dqkv && scratch && dout && qkv && att, "null buffer");
  CheckArgs(B, T, C, NH);
  const int HS = C / NH;
  const long TT = static_cast<long>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  float* datt = static_cast<float*>(scratch);  // (NH,T,T) fp32
  bf16* dscores = reinterpret_cast<bf16*>(static_cast<char*>(scratch) +
                                          launch::AttentionDscoresOffset(T, NH));  // (NH,T,T)
  const int rows = NH * T;
  for (int b = 0; b < B; ++b) {
    const bf16* att_b = att + static_cast<long>(b) * NH * TT;  // (NH,T,T)
    Run(ctx, launch::AttentionDattShape(b, T, C, NH), qkv, dout, datt, CUDA_R_32F, stream);
    Run(ctx, launch::AttentionDvShape(b, T, C, NH), dout, att, dqkv, CUDA_R_16BF, stream);
    CausalSoftmaxBackwardKernel<<<launch::WarpRowBlocks(rows, launch::kBlock), launch::kBlock, 0,
                                  stream>>>(dscores, datt, att_b, rows, T, scale);
    LOOM_CUDA_CHECK_LAUNCH();
    Run(ctx, launch::AttentionDqShape(b, T, C, NH), qkv, dscores, dqkv, CUDA_R_16BF, stream);
    Run(ctx, launch::AttentionDkShape(b, T, C, NH), qkv, dscores, dqkv, CUDA_R_16BF, stream);
  }
}

}  // namespace loom::kernels::cuda
