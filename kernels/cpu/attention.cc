// CPU fp32 causal multi-head self-attention. Contract: kernels/attention.h.
//
// For each (b, h), with Q, K, V the (T,HS) slices of qkv (row stride 3C):
//   forward:  S = Q K^T * scale (cblas_sgemm), causal row softmax -> att, out_h = att V (sgemm)
//   backward: datt = dout_h V^T, dV += att^T dout_h, dS = att * (datt - rowsum(att * datt)),
//             dQ += scale dS K, dK += scale dS^T Q (all GEMMs on cblas_sgemm).
// The full T x T score product is computed (the masked half is then zeroed) because one large
// GEMM call beats T small ones at the sizes the model uses.
//
// Threading: the B*NH (b, h) pairs are split statically across OpenMP threads. Each pair writes
// only its own att/scratch block and its own head's channels of out/dqkv, so there are no races
// and no cross-thread reductions: results do not depend on the thread count. While
// T*T*HS <= 2^18 (e.g. T = 64, HS = 64) OpenBLAS runs each GEMM on the calling thread; above
// that it also uses its own pool from inside the OpenMP threads, which is correct (OpenBLAS is
// thread-safe and splits GEMMs by output) but oversubscribes the cores.
#include "kernels/attention.h"

#include <cblas.h>

#include <cmath>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

void CheckArgs(int B, int T, int C, int NH) {
  LOOM_KERNEL_CHECK(B > 0 && T > 0 && C > 0 && NH > 0, "B, T, C and NH must be positive");
  LOOM_KERNEL_CHECK(C % NH == 0, "C must be divisible by NH");
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  LOOM_KERNEL_CHECK(out && att && qkv, "null buffer");
  CheckArgs(B, T, C, NH);
  const int HS = C / NH;
  const long C3 = 3L * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int pairs = B * NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < pairs; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const float* q = qkv + b * T * C3 + h * HS;              // (T,HS), row stride 3C
    const float* k = q + C;                                  // (T,HS), row stride 3C
    const float* v = q + 2 * C;                              // (T,HS), row stride 3C
    float* a = att + static_cast<long>(bh) * T * T;          // (T,T)
    float* o = out + static_cast<long>(b) * T * C + h * HS;  // (T,HS), row stride C
    // a (T,T) = scale * q k^T.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, C3, k, C3, 0.0f, a, T);
    // Causal softmax of each row over columns [0, t]; the masked columns are written 0.
    for (int t = 0; t < T; ++t) {
      float* row = a + static_cast<long>(t) * T;
      float maxv = row[0];
      for (int j = 1; j <= t; ++j) maxv = std::fmax(maxv, row[j]);
      float sum = 0.0f;
      for (int j = 0; j <= t; ++j) {
        const float e = std::exp(row[j] - maxv);
        row[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (int j = 0; j <= t; ++j) row[j] *= inv;
      for (int j = t + 1; j < T; ++j) row[j] = 0.0f;
    }
    // o (T,HS) = a (T,T) @ v (T,HS).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, v, C3, 0.0f, o, C);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  LOOM_KERNEL_CHECK(dqkv && scratch && dout && qkv && att, "null buffer");
  CheckArgs(B, T, C, NH);
  const int HS = C / NH;
  const long C3 = 3L * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int pairs = B * NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < pairs; ++bh) {
    const int b = bh / NH;
    const int h = bh % NH;
    const long q_off = b * T * C3 + h * HS;
    const float* q = qkv + q_off;                                    // (T,HS), row stride 3C
    const float* k = q + C;                                          // (T,HS), row stride 3C
    const float* v = q + 2 * C;                                      // (T,HS), row stride 3C
    float* dq = dqkv + q_off;                                        // (T,HS), row stride 3C
    float* dk = dq + C;                                              // (T,HS), row stride 3C
    float* dv = dq + 2 * C;                                          // (T,HS), row stride 3C
    const float* a = att + static_cast<long>(bh) * T * T;            // (T,T)
    float* ds = scratch + static_cast<long>(bh) * T * T;             // (T,T): datt, then dscores
    const float* dy = dout + static_cast<long>(b) * T * C + h * HS;  // (T,HS), row stride C
    // datt (T,T) = dy (T,HS) @ v (T,HS)^T.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, dy, C, v, C3, 0.0f, ds, T);
    // dv (T,HS) += a (T,T)^T @ dy (T,HS).
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, dy, C, 1.0f, dv, C3);
    // Softmax backward per row, with the 1/sqrt(HS) of the scores folded in:
    // dscores[t,j] = scale * a[t,j] * (datt[t,j] - sum_i a[t,i] datt[t,i]), 0 where masked.
    for (int t = 0; t < T; ++t) {
      const float* arow = a + static_cast<long>(t) * T;
      float* drow = ds + static_cast<long>(t) * T;
      float dot = 0.0f;
      for (int j = 0; j <= t; ++j) dot += arow[j] * drow[j];
      for (int j = 0; j <= t; ++j) drow[j] = scale * arow[j] * (drow[j] - dot);
      for (int j = t + 1; j < T; ++j) drow[j] = 0.0f;
    }
    // dq (T,HS) += dscores (T,T) @ k (T,HS);  dk (T,HS) += dscores^T @ q (T,HS).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, ds, T, k, C3, 1.0f, dq,
                C3);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, ds, T, q, C3, 1.0f, dk,
                C3);
  }
}

}  // namespace loom::kernels::cpu
