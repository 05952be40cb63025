// Error checks for CUDA runtime, cuBLAS and cuBLASLt calls in the CUDA backend. A failed call is
// a broken device or a programming error, never a runtime condition the caller can handle: it
// prints file:line, the call and the library's own message to stderr and exits with status 1
// (the training core's error regime; see kernels/README.md). Host code only.
#ifndef LOOM_KERNELS_CUDA_CHECK_H_
#define LOOM_KERNELS_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace loom::kernels::cuda::internal {

// Prints "file:line: CUDA error in `call`: name: message" and exits with status 1.
[[noreturn]] inline void CudaFailed(const char* file, int line, const char* call, cudaError_t err) {
  std::fprintf(stderr, "%s:%d: CUDA error in `%s`: %s: %s\n", file, line, call,
               cudaGetErrorName(err), cudaGetErrorString(err));
  std::fflush(stderr);
  std::exit(1);
}

// Same for a cuBLAS or cuBLASLt status (both use cublasStatus_t).
[[noreturn]] inline void CublasFailed(const char* file, int line, const char* call,
                                      cublasStatus_t status) {
  std::fprintf(stderr, "%s:%d: cuBLAS error in `%s`: %d: %s\n", file, line, call,
               static_cast<int>(status), cublasGetStatusString(status));
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace loom::kernels::cuda::internal

// LOOM_CUDA_CHECK(call): runs a CUDA runtime call; on any error reports it and exits.
#define LOOM_CUDA_CHECK(call)                                                                 \
  do {                                                                                        \
    const cudaError_t loom_cuda_err_ = (call);                                                \
    if (loom_cuda_err_ != cudaSuccess) {                                                      \
      ::loom::kernels::cuda::internal::CudaFailed(__FILE__, __LINE__, #call, loom_cuda_err_); \
    }                                                                                         \
  } while (0)

// LOOM_CUBLAS_CHECK(call): runs a cuBLAS or cuBLASLt call; on any error reports it and exits.
#define LOOM_CUBLAS_CHECK(call)                                                \
  do {                                                                         \
    const cublasStatus_t loom_cublas_status_ = (call);                         \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                        \
      ::loom::kernels::cuda::internal::CublasFailed(__FILE__, __LINE__, #call, \
                                                    loom_cublas_status_);      \
    }                                                                          \
  } while (0)

// LOOM_CUDA_CHECK_LAUNCH(): checks the last kernel launch (bad configuration, no device).
// Asynchronous faults inside the kernel surface at the next synchronising call's check.
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())

#endif  // LOOM_KERNELS_CUDA_CHECK_H_
