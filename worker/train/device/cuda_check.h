// LOOM_TRAIN_CUDA_CHECK: the training core's check of a CUDA runtime call. On failure it prints
// file:line, the call, and CUDA's error name and message, and exits with kExitCrash (error.h).
// Only for files built with LOOM_CUDA.
#ifndef LOOM_WORKER_TRAIN_DEVICE_CUDA_CHECK_H_
#define LOOM_WORKER_TRAIN_DEVICE_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <string>

#include "worker/train/error.h"

#define LOOM_TRAIN_CUDA_CHECK(expr)                                                                \
  do {                                                                                             \
    const cudaError_t loom_cuda_err_ = (expr);                                                     \
    if (loom_cuda_err_ != cudaSuccess) {                                                           \
      ::loom::train::CrashAt(__FILE__, __LINE__,                                                   \
                             std::string(#expr) + ": " + cudaGetErrorName(loom_cuda_err_) + ": " + \
                                 cudaGetErrorString(loom_cuda_err_));                              \
    }                                                                                              \
  } while (0)

#endif  // LOOM_WORKER_TRAIN_DEVICE_CUDA_CHECK_H_
