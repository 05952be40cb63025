// The cuBLAS and cuBLASLt state the GEMM-based ops (matmul, attention) share: both library
// handles and one cuBLASLt workspace, which matmul_backward also reuses as scratch for its bias
// gradient partial sums.
//
// Threading: a context may be used from one host thread at a time, and by kernels on one stream
// at a time: the workspace is reused by every call, and stream order is what keeps two calls
// from using it at once. Give each concurrently used stream its own context.
#ifndef LOOM_KERNELS_CUDA_GEMM_CONTEXT_H_
#define LOOM_KERNELS_CUDA_GEMM_CONTEXT_H_

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>

#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

class GemmContext {
 public:
  // Creates both handles and allocates workspace_bytes of device memory on the current device.
  // A failure (no device, out of memory) prints the library's message and exits.
  explicit GemmContext(size_t workspace_bytes = launch::kMatmulWorkspaceBytes);
  // Waits for nothing: the caller must have synchronised every stream that used the context.
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  cublasHandle_t blas() const { return blas_; }
  cublasLtHandle_t lt() const { return lt_; }
  // Device memory, workspace_bytes() long, 256-byte aligned (cudaMalloc).
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_GEMM_CONTEXT_H_
