// Fully connected layer on bf16 device buffers: GEMMs on cuBLASLt (bf16 operands, fp32 compute
// and accumulation), with the bias and GELU fused into the GEMM epilogue where cuBLASLt offers
// it. CPU contract: kernels/matmul.h. Conventions: kernels/cuda/README.md.
//
// Every call enqueues on `stream` and uses ctx's handles and workspace (one stream per context;
// see gemm_context.h).
#ifndef LOOM_KERNELS_CUDA_MATMUL_H_
#define LOOM_KERNELS_CUDA_MATMUL_H_

#include "kernels/cuda/gemm_context.h"
#include "kernels/cuda/types.h"

namespace loom::kernels::cuda {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC). bias may be nullptr (no bias).
// The bias is added in the GEMM epilogue (before the single bf16 rounding of out).
void matmul_forward(GemmContext& ctx, bf16* out, const bf16* inp, const bf16* weight,
                    const bf16* bias, int N, int C, int OC, cudaStream_t stream);

// pre_gelu (N,OC) = inp @ weight^T + bias (saved for gelu_backward); out (N,OC) =
// gelu(pre_gelu), the tanh approximation. In one cuBLASLt call (GELU_AUX_BIAS epilogue, which
// applies GELU to the fp32 accumulator) when OC is a multiple of 8 and the library has an
// algorithm for the shape; otherwise matmul_forward into pre_gelu and then gelu_forward.
// bias may be nullptr. out and pre_gelu must not alias.
void matmul_gelu_forward(GemmContext& ctx, bf16* out, bf16* pre_gelu, const bf16* inp,
                         const bf16* weight, const bf16* bias, int N, int C, int OC,
                         cudaStream_t stream);

// dinp (N,C) += dout (N,OC) @ weight (OC,C)        (skipped when dinp is nullptr)
// dweight (OC,C) += dout^T @ inp (N,C)
// dbias (OC) += sum_n dout                          (skipped when dbias is nullptr)
// Accumulates (GEMMs with beta = 1; one bf16 rounding per element per call). The bias gradient
// is a deterministic two-pass column sum whose partials live in ctx's workspace.
void matmul_backward(GemmContext& ctx, bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout,
                     const bf16* inp, const bf16* weight, int N, int C, int OC,
                     cudaStream_t stream);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_MATMUL_H_
