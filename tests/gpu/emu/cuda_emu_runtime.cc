// The emulated CUDA runtime, cuBLAS and cuBLASLt for tests/gpu/emu (see cuda_emu.h): host memory
// for device memory, and GEMMs computed in double on the host with cuBLAS's column-major
// semantics. The cuBLASLt stand-in checks what the real library would reject (layouts that do
// not match the operation, epilogue pointers that do not match the epilogue, a GELU aux leading
// dimension that is not a multiple of 8) and records it for ShapeErrors().
// Environment: LOOM_EMU_NO_LT=1 makes the cuBLASLt heuristic find no algorithm, so the ops take
// their cublasGemmEx fallbacks.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace loom::emu {

thread_local Block* current_block = nullptr;

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::abort();
}

int shape_errors = 0;

void ShapeError(const char* what) {
  std::fprintf(stderr, "cuda_emu: the real library would reject this: %s\n", what);
  ++shape_errors;
}

float Load(const void* p, cudaDataType t, long i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  Die("unsupported data type");
}

void Store(void* p, cudaDataType t, long i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
  } else if (t == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  } else {
    Die("unsupported data type");
  }
}

// D = alpha op(A) op(B) + beta D (+ bias over rows) (-> aux = pre-GELU, D = GELU), column-major,
// strided-batched.
struct Gemm {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  cudaDataType at = CUDA_R_16BF;
  long lda = 0;
  long long sa = 0;
  const void* b = nullptr;
  cudaDataType bt = CUDA_R_16BF;
  long ldb = 0;
  long long sb = 0;
  void* d = nullptr;
  cudaDataType dt = CUDA_R_16BF;
  long ldd = 0;
  long long sd = 0;
  int batch = 1;
  const void* bias = nullptr;
  void* aux = nullptr;
  long aux_ld = 0;
  bool gelu = false;
};

void RunGemm(const Gemm& g) {
  if (g.lda < (g.ta ? g.k : g.m) || g.ldb < (g.tb ? g.n : g.k) || g.ldd < g.m) {
    ShapeError("leading dimension too small");
  }
  for (int q = 0; q < g.batch; ++q) {
    for (int j = 0; j < g.n; ++j) {
      for (int i = 0; i < g.m; ++i) {
        double acc = 0.0;
        for (int p = 0; p < g.k; ++p) {
          const long ai = q * g.sa + (g.ta ? p + i * g.lda : i + p * g.lda);
          const long bi = q * g.sb + (g.tb ? j + p * g.ldb : p + j * g.ldb);
          acc += static_cast<double>(Load(g.a, g.at, ai)) * Load(g.b, g.bt, bi);
        }
        const long di = q * g.sd + i + j * g.ldd;
        float v = g.alpha * static_cast<float>(acc) +
                  (g.beta != 0.0f ? g.beta * Load(g.d, g.dt, di) : 0.0f);
        if (g.bias != nullptr) v += Load(g.bias, g.dt, i);
        if (g.aux != nullptr) Store(g.aux, g.dt, i + j * g.aux_ld, v);
        if (g.gelu)
          v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        Store(g.d, g.dt, di, v);
      }
    }
  }
}

struct LtDesc {
  bool ta = false, tb = false;
  int epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

struct LtLayout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};

template <typename T>
T Read(const void* buf, size_t size) {
  if (size != sizeof(T)) Die("attribute of the wrong size");
  T v;
  std::memcpy(&v, buf, sizeof(T));
  return v;
}

}  // namespace

int ShapeErrors() { return shape_errors; }

void RunGrid(dim3 grid, dim3 block, const std::function<void()>& body) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x > 1024 || block.x % 32 != 0) {
    Die("only 1-D blocks of a multiple of 32 threads (at most 1024)");
  }
  if (grid.y > 65535 || grid.z > 65535) Die("grid.y or grid.z above 65535");
  const int threads = static_cast<int>(block.x);
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b;
        b.barrier = std::make_unique<std::barrier<>>(threads);
        b.warps.resize(threads / 32);
        for (Warp& w : b.warps) w.barrier = std::make_unique<std::barrier<>>(32);
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
            blockIdx = uint3{bx, by, bz};
            blockDim = block;
            gridDim = grid;
            current_block = &b;
            body();
            b.warps[t / 32].barrier->arrive_and_drop();
            b.barrier->arrive_and_drop();
          });
        }
        for (std::thread& th : pool) th.join();
      }
    }
  }
}

}  // namespace loom::emu

using loom::emu::Gemm;
using loom::emu::LtDesc;
using loom::emu::LtLayout;

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);  // cudaMalloc aligns to 256 bytes
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cuda_emu"; }
const char* cudaGetErrorString(cudaError_t) { return "cuda_emu"; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete[] reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t) { return "cuda_emu"; }

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* a, cudaDataType at,
                            int lda, const void* b, cudaDataType bt, int ldb, const void* beta,
                            void* d, cudaDataType dt, int ldd, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  return cublasGemmStridedBatchedEx(nullptr, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0,
                                    beta, d, dt, ldd, 0, 1, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType at,
                                          int lda, long long sa, const void* b, cudaDataType bt,
                                          int ldb, long long sb, const void* beta, void* d,
                                          cudaDataType dt, int ldd, long long sd, int batch,
                                          cublasComputeType_t, cublasGemmAlgo_t) {
  Gemm g;
  g.ta = ta == CUBLAS_OP_T;
  g.tb = tb == CUBLAS_OP_T;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a = a;
  g.at = at;
  g.lda = lda;
  g.sa = sa;
  g.b = b;
  g.bt = bt;
  g.ldb = ldb;
  g.sb = sb;
  g.d = d;
  g.dt = dt;
  g.ldd = ldd;
  g.sd = sd;
  g.batch = batch;
  loom::emu::RunGemm(g);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete[] reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t,
                                        cudaDataType_t) {
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new LtDesc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<LtDesc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  LtDesc* x = reinterpret_cast<LtDesc*>(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      x->ta = loom::emu::Read<int32_t>(buf, size) == CUBLAS_OP_T;
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      x->tb = loom::emu::Read<int32_t>(buf, size) == CUBLAS_OP_T;
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      x->epilogue = loom::emu::Read<int32_t>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      x->bias = loom::emu::Read<const void*>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      x->aux = loom::emu::Read<void*>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      x->aux_ld = loom::emu::Read<int64_t>(buf, size);
      break;
    default:
      loom::emu::Die("matmul descriptor attribute not emulated");
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new LtLayout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<LtLayout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete[] reinterpret_cast<char*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    loom::emu::Read<uint64_t>(buf, size);
  } else {
    loom::emu::Read<uint32_t>(buf, size);  // the MIN_ALIGNMENT_*_BYTES preferences
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int,
                                              cublasLtMatmulHeuristicResult_t*, int* found) {
  *found = std::getenv("LOOM_EMU_NO_LT") != nullptr ? 0 : 1;
  return *found ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t la, const void* b,
                              cublasLtMatrixLayout_t lb, const void* beta, const void* c,
                              cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) {
  const LtDesc* x = reinterpret_cast<const LtDesc*>(desc);
  const LtLayout* A = reinterpret_cast<const LtLayout*>(la);
  const LtLayout* B = reinterpret_cast<const LtLayout*>(lb);
  const LtLayout* D = reinterpret_cast<const LtLayout*>(ld);
  if (c != d || lc != ld) loom::emu::Die("only in-place C == D is emulated");
  Gemm g;
  g.ta = x->ta;
  g.tb = x->tb;
  g.m = static_cast<int>(D->rows);
  g.n = static_cast<int>(D->cols);
  g.k = static_cast<int>(x->ta ? A->rows : A->cols);
  if ((x->ta ? A->cols : A->rows) != D->rows || (x->tb ? B->rows : B->cols) != D->cols ||
      (x->tb ? B->cols : B->rows) != static_cast<uint64_t>(g.k)) {
    loom::emu::ShapeError("matrix layouts do not match the operation");
  }
  const bool has_bias =
      x->epilogue == CUBLASLT_EPILOGUE_BIAS || x->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  g.gelu =
      x->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || x->epilogue == CUBLASLT_EPILOGUE_GELU_AUX;
  if (has_bias != (x->bias != nullptr) || g.gelu != (x->aux != nullptr)) {
    loom::emu::ShapeError("epilogue pointers do not match the epilogue");
  }
  if (g.gelu && (x->aux_ld % 8 != 0 || x->aux_ld < g.m)) {
    loom::emu::ShapeError("GELU aux leading dimension");
  }
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a = a;
  g.at = A->type;
  g.lda = A->ld;
  g.b = b;
  g.bt = B->type;
  g.ldb = B->ld;
  g.d = d;
  g.dt = D->type;
  g.ldd = D->ld;
  g.bias = has_bias ? x->bias : nullptr;
  g.aux = g.gelu ? x->aux : nullptr;
  g.aux_ld = x->aux_ld;
  loom::emu::RunGemm(g);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
