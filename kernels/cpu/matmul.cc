// CPU fp32 fully connected layer on OpenBLAS. Contract: kernels/matmul.h.
//
// Threading: only OpenBLAS's own threads. It splits each GEMM's output among its threads and keeps
// every element's reduction over the inner dimension whole, so results do not depend on the run.
// In a build without a BLAS library, <cblas.h> is kernels/cpu/cblas_fallback/cblas.h and the
// GEMMs run the built-in fallback (cpu/sgemm_fallback.h), which splits the output by tile across
// OpenMP threads with the same whole-reduction property.
// The bias broadcast and bias gradient are O(N*OC) beside the O(N*C*OC) GEMMs and run on the
// calling thread: an OpenMP region here would alternate OpenMP's and OpenBLAS's thread pools
// within one op, and each pool's spinning workers slow the other down (measured: 4x on a loaded
// 2-core machine). The bias gradient sums rows in order, in fixed channel chunks.
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

constexpr int kChannelChunk = 64;

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  LOOM_KERNEL_CHECK(out && inp && weight, "null buffer");
  LOOM_KERNEL_CHECK(N > 0 && C > 0 && OC > 0, "N, C and OC must be positive");
  float beta = 0.0f;
  if (bias != nullptr) {
    // Broadcast the bias into out, then let the GEMM accumulate onto it (beta = 1): one pass
    // over out instead of two.
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<long>(n) * OC);
    beta = 1.0f;
  }
  // out (N,OC) = inp (N,C) @ weight (OC,C)^T (+ out).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
              OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  LOOM_KERNEL_CHECK(dweight && dout && inp && weight, "null buffer");
  LOOM_KERNEL_CHECK(N > 0 && C > 0 && OC > 0, "N, C and OC must be positive");
  if (dinp != nullptr) {
    // dinp (N,C) += dout (N,OC) @ weight (OC,C).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  // dweight (OC,C) += dout (N,OC)^T @ inp (N,C).
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias != nullptr) {
    const int chunks = (OC + kChannelChunk - 1) / kChannelChunk;
    for (int k = 0; k < chunks; ++k) {
      const int o0 = k * kChannelChunk;
      const int o1 = std::min(OC, o0 + kChannelChunk);
      float acc[kChannelChunk] = {};
      for (int n = 0; n < N; ++n) {
        const float* dy = dout + static_cast<long>(n) * OC;  // (OC)
        for (int o = o0; o < o1; ++o) acc[o - o0] += dy[o];
      }
      for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
    }
  }
}

}  // namespace loom::kernels::cpu
