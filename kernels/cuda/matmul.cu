// Fully connected layer on cuBLASLt. Contract: kernels/cuda/matmul.h.
//
// The three GEMMs (forward, dinp, dweight) and their row-major to column-major mapping are in
// gemm_shapes.h. The bias is a vector over m = OC, the rows of the column-major output: the
// BIAS epilogue.
//
// Each call builds its descriptors and asks the heuristic for one algorithm (a few microseconds;
// negligible beside the GEMMs of the model). When cuBLASLt has no algorithm for a shape or an
// epilogue (odd leading dimensions, unusual alignment), the op falls back to cublasGemmEx plus
// separate bias / GELU kernels, which accept any shape.
#include "kernels/cuda/matmul.h"

#include <cstdint>

#include "kernels/arg_check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/gemm_shapes.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {
namespace {

// One column-major GEMM: D (m,n) = op(A) (m,k) . op(B) (k,n) [+ beta D] [+ bias] [-> GELU].
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  const bf16* a = nullptr;
  int lda = 0;
  const bf16* b = nullptr;
  int ldb = 0;
  bf16* d = nullptr;
  int ldd = 0;
  float beta = 0.0f;
  const bf16* bias = nullptr;  // (m), or nullptr
  bf16* pre_gelu = nullptr;    // (m,n) ld ldd: GELU input; when set, D = GELU(...)
};

template <typename T>
void SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <typename T>
void SetPref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
             const T& value) {
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// Runs g on cuBLASLt. Returns false, having enqueued nothing, when the heuristic finds no
// algorithm for it or the library reports the configuration unsupported.
bool RunLt(GemmContext& ctx, const Gemm& g, cudaStream_t stream) {
  cublasLtMatmulDesc_t desc;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (g.pre_gelu != nullptr) {
    epilogue = g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  } else if (g.bias != nullptr) {
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  }
  SetDesc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (g.bias != nullptr) SetDesc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.pre_gelu != nullptr) {
    SetDesc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.pre_gelu);
    SetDesc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.ldd));
  }
  // Layouts of the stored (pre-op) matrices, column-major.
  cublasLtMatrixLayout_t la, lb, ld;
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, g.trans_a ? g.k : g.m,
                                               g.trans_a ? g.m : g.k, g.lda));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, g.trans_b ? g.n : g.k,
                                               g.trans_b ? g.k : g.n, g.ldb));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, g.m, g.n, g.ldd));
  cublasLtMatmulPreference_t pref;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  SetPref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
          static_cast<uint64_t>(ctx.workspace_bytes()));
  // Tell the heuristic the real alignment, or it assumes 256 bytes and may pick an algorithm
  // that faults on a sliced buffer.
  SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, launch::PointerAlignment(g.a));
  SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, launch::PointerAlignment(g.b));
  SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, launch::PointerAlignment(g.d));
  SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, launch::PointerAlignment(g.d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt(), desc, la, lb, ld, ld, pref, 1, &result, &found);
  bool ok = status == CUBLAS_STATUS_SUCCESS && found > 0;
  if (ok) {
    const float alpha = 1.0f;
    const cublasStatus_t run =
        cublasLtMatmul(ctx.lt(), desc, &alpha, g.a, la, g.b, lb, &g.beta, g.d, ld, g.d, ld,
                       &result.algo, ctx.workspace(), ctx.workspace_bytes(), stream);
    // NOT_SUPPORTED means nothing was enqueued: the caller falls back. Anything else is fatal.
    if (run == CUBLAS_STATUS_NOT_SUPPORTED) {
      ok = false;
    } else {
      LOOM_CUBLAS_CHECK(run);
    }
  }
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
  return ok;
}

// Runs g (no epilogue) on cuBLASLt, or on cublasGemmEx when cuBLASLt has no algorithm.
void RunPlain(GemmContext& ctx, const Gemm& g, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(g.bias == nullptr && g.pre_gelu == nullptr, "plain GEMM has no epilogue");
  if (RunLt(ctx, g, stream)) return;
  const float alpha = 1.0f;
  LOOM_CUBLAS_CHECK(cublasSetStream(ctx.blas(), stream));
  LOOM_CUBLAS_CHECK(cublasGemmEx(ctx.blas(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, g.a,
                                 CUDA_R_16BF, g.lda, g.b, CUDA_R_16BF, g.ldb, &g.beta, g.d,
                                 CUDA_R_16BF, g.ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// out (N,OC) = bias broadcast over rows: the fallback's starting point for a beta = 1 GEMM.
__global__ void BroadcastBiasKernel(bf16* out, const bf16* bias, long N, int OC) {
  const long items = N * OC;
  for (long i = device::GlobalThread(); i < items; i += device::GridStride()) {
    out[i] = bias[i % OC];
  }
}

// grid (ceil(OC / blockDim.x), chunks): partial (chunks, OC) = sums of dout over chunk rows.
__global__ void BiasGradPartialKernel(float* partial, const bf16* dout, int N, int OC,
                                      int rows_per_chunk) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  const long n0 = static_cast<long>(blockIdx.y) * rows_per_chunk;
  const long n1 = min(static_cast<long>(N), n0 + rows_per_chunk);
  float acc = 0.0f;
  for (long n = n0; n < n1; ++n) acc += __bfloat162float(dout[n * OC + o]);
  partial[static_cast<long>(blockIdx.y) * OC + o] = acc;
}

// dbias (OC) += sum over chunks of partial, in chunk order.
__global__ void BiasGradFinalKernel(bf16* dbias, const float* partial, int chunks, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; ++k) acc += partial[static_cast<long>(k) * OC + o];
  dbias[o] = __float2bfloat16(__bfloat162float(dbias[o]) + acc);
}

// The Gemm of a gemm_shapes.h shape (unbatched) over buffers a, b, d.
Gemm FromShape(const launch::GemmShape& shape, const bf16* a, const bf16* b, bf16* d) {
  Gemm g;
  g.trans_a = shape.trans_a;
  g.trans_b = shape.trans_b;
  g.m = shape.m;
  g.n = shape.n;
  g.k = shape.k;
  g.a = a + shape.a_offset;
  g.lda = shape.lda;
  g.b = b + shape.b_offset;
  g.ldb = shape.ldb;
  g.d = d + shape.d_offset;
  g.ldd = shape.ldd;
  g.beta = shape.beta;
  return g;
}

void CheckArgs(int N, int C, int OC) {
  LOOM_KERNEL_CHECK(N > 0 && C > 0 && OC > 0, "N, C and OC must be positive");
}

}  // namespace

void matmul_forward(GemmContext& ctx, bf16* out, const bf16* inp, const bf16* weight,
                    const bf16* bias, int N, int C, int OC, cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && inp && weight, "null buffer");
  CheckArgs(N, C, OC);
  Gemm g = FromShape(launch::MatmulForwardShape(N, C, OC), weight, inp, out);
  if (bias == nullptr) {
    RunPlain(ctx, g, stream);
    return;
  }
  g.bias = bias;
  if (RunLt(ctx, g, stream)) return;
  // Fallback: broadcast the bias into out, then accumulate the product onto it.
  BroadcastBiasKernel<<<launch::GridBlocks(static_cast<long>(N) * OC, launch::kBlock),
                        launch::kBlock, 0, stream>>>(out, bias, N, OC);
  LOOM_CUDA_CHECK_LAUNCH();
  g.bias = nullptr;
  g.beta = 1.0f;
  RunPlain(ctx, g, stream);
}

void matmul_gelu_forward(GemmContext& ctx, bf16* out, bf16* pre_gelu, const bf16* inp,
                         const bf16* weight, const bf16* bias, int N, int C, int OC,
                         cudaStream_t stream) {
  LOOM_KERNEL_CHECK(out && pre_gelu && inp && weight, "null buffer");
  LOOM_KERNEL_CHECK(out != pre_gelu, "out and pre_gelu must not alias");
  CheckArgs(N, C, OC);
  if (OC % 8 == 0) {  // cuBLASLt wants the GELU aux leading dimension a multiple of 8
    Gemm g = FromShape(launch::MatmulForwardShape(N, C, OC), weight, inp, out);
    g.bias = bias;
    g.pre_gelu = pre_gelu;
    if (RunLt(ctx, g, stream)) return;
  }
  matmul_forward(ctx, pre_gelu, inp, weight, bias, N, C, OC, stream);
  gelu_forward(out, pre_gelu, static_cast<long>(N) * OC, stream);
}

void matmul_backward(GemmContext& ctx, bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout,
                     const bf16* inp, const bf16* weight, int N, int C, int OC,
                     cudaStream_t stream) {
  LOOM_KERNEL_CHECK(dweight && dout && inp && weight, "null buffer");
  CheckArgs(N, C, OC);
  if (dinp != nullptr) {
    RunPlain(ctx, FromShape(launch::MatmulBackwardInputShape(N, C, OC), weight, dout, dinp),
             stream);
  }
  RunPlain(ctx, FromShape(launch::MatmulBackwardWeightShape(N, C, OC), inp, dout, dweight), stream);
  if (dbias != nullptr) {
    // The partials reuse the workspace: the GEMMs above are done with it in stream order.
    const long rows = launch::ColumnSumRowsPerChunk(N, OC, ctx.workspace_bytes());
    LOOM_KERNEL_CHECK(rows > 0, "OC too large for the bias-gradient scratch in the workspace");
    const long chunks = launch::CeilDiv(N, rows);
    LOOM_KERNEL_CHECK(chunks <= 65535, "N too large for the grid.y of the bias gradient");
    float* partial = static_cast<float*>(ctx.workspace());  // (chunks, OC)
    const int column_blocks = static_cast<int>(launch::CeilDiv(OC, launch::kBlock));
    BiasGradPartialKernel<<<dim3(column_blocks, static_cast<unsigned>(chunks)), launch::kBlock, 0,
                            stream>>>(partial, dout, N, OC, static_cast<int>(rows));
    LOOM_CUDA_CHECK_LAUNCH();
    BiasGradFinalKernel<<<column_blocks, launch::kBlock, 0, stream>>>(dbias, partial,
                                                                      static_cast<int>(chunks), OC);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace loom::kernels::cuda
