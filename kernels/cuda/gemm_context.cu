// GemmContext: cuBLAS/cuBLASLt handles and workspace. Contract: kernels/cuda/gemm_context.h.
#include "kernels/cuda/gemm_context.h"

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"

namespace loom::kernels::cuda {

GemmContext::GemmContext(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  LOOM_KERNEL_CHECK(workspace_bytes > 0, "the workspace must not be empty");
  LOOM_CUBLAS_CHECK(cublasCreate(&blas_));
  LOOM_CUBLAS_CHECK(cublasLtCreate(&lt_));
  LOOM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmContext::~GemmContext() {
  // Errors here are reported but cannot be recovered from; the macros exit as everywhere else.
  LOOM_CUDA_CHECK(cudaFree(workspace_));
  LOOM_CUBLAS_CHECK(cublasLtDestroy(lt_));
  LOOM_CUBLAS_CHECK(cublasDestroy(blas_));
}

}  // namespace loom::kernels::cuda
