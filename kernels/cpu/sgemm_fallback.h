// A portable fp32 GEMM for machines without a BLAS library (the GPU machine has CUDA but no
// OpenBLAS). Always compiled, so the unit tests exercise it on every machine; the CPU ops reach it
// through kernels/cpu/cblas_fallback/cblas.h only when configure found no BLAS
// (kernels/CMakeLists.txt).
#ifndef LOOM_KERNELS_CPU_SGEMM_FALLBACK_H_
#define LOOM_KERNELS_CPU_SGEMM_FALLBACK_H_

namespace loom::kernels::cpu {

// Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, the semantics of
// cblas_sgemm(CblasRowMajor, ...): op(A) is A (M,K) with row stride lda, or, when trans_a, the
// transpose of A (K,M) with row stride lda; likewise op(B) with trans_b and ldb; C has row stride
// ldc. With beta == 0, C is only written (NaN or garbage in it does not propagate).
//
// Accumulates in fp32. Each element's sum over K runs in order on one thread, in fixed blocks, so
// results are bit-for-bit the same for every OpenMP thread count. Without OpenMP it runs serially.
void sgemm_fallback(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_CPU_SGEMM_FALLBACK_H_
