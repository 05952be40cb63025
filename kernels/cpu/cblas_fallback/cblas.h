// The one CBLAS routine the CPU ops call (cblas_sgemm), for builds without a BLAS library.
//
// kernels/CMakeLists.txt puts this folder on loom_kernels' include path only when configure found
// no BLAS; `#include <cblas.h>` in the ops then lands here and cblas_sgemm runs the built-in
// fallback GEMM (kernels/cpu/sgemm_fallback.h). The ops keep a single code path, and a build with
// OpenBLAS compiles exactly as before. Enum values and the signature follow the CBLAS standard
// (as in OpenBLAS's cblas.h); the function has C++ linkage, so it can never be mistaken for, or
// collide with, a real BLAS's symbol.
#ifndef LOOM_KERNELS_CPU_CBLAS_FALLBACK_CBLAS_H_
#define LOOM_KERNELS_CPU_CBLAS_FALLBACK_CBLAS_H_

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

// C = alpha * op(A) @ op(B) + beta * C, with the CBLAS argument conventions.
void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N,
                 int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                 float* C, int ldc);

#endif  // LOOM_KERNELS_CPU_CBLAS_FALLBACK_CBLAS_H_
