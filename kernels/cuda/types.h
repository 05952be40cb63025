// Element types of the CUDA backend, includable from plain C++ (host compilers included).
//
// Storage and precision (DESIGN.md, "Ops"): parameters, activations and gradients are bf16;
// every kernel accumulates in fp32; master weights, AdamW moments, layernorm statistics, losses
// and cross-entropy row statistics are fp32.
#ifndef LOOM_KERNELS_CUDA_TYPES_H_
#define LOOM_KERNELS_CUDA_TYPES_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace loom::kernels::cuda {

using bf16 = __nv_bfloat16;

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_TYPES_H_
