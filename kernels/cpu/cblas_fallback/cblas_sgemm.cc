// cblas_sgemm on the built-in fallback GEMM; compiled only in builds without a BLAS library
// (kernels/CMakeLists.txt, see cblas.h here).
#include "kernels/cpu/cblas_fallback/cblas.h"
#include "kernels/cpu/sgemm_fallback.h"

void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N,
                 int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                 float* C, int ldc) {
  // Real data: a conjugate transpose is a transpose.
  const bool ta = trans_a != CblasNoTrans;
  const bool tb = trans_b != CblasNoTrans;
  if (order == CblasRowMajor) {
    loom::kernels::cpu::sgemm_fallback(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    // Column-major C (M,N) is row-major C^T (N,M) = op(B)^T op(A)^T: swap the operands.
    loom::kernels::cpu::sgemm_fallback(tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
  }
}
