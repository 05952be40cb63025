// Numerical checks of the CUDA ops (kernels/cuda/) against the double-precision references
// (kernels/ref/), shared by the gtest binary tests/kernels/cuda_ops_test.cc (small and odd
// shapes) and the device check program loom-gpu-op-check (GPT-2 124M shapes).
//
// Every check draws fresh random inputs (never zeros), rounds them to bf16 on the host, feeds
// the same values to the op and (widened to double) to the reference, poisons every forward
// output with NaN bytes first, starts every accumulated gradient from non-zero values, and
// reports ||out - ref|| / ||ref|| per output. NaN or Inf anywhere in an output is an infinite
// error, so it never passes.
//
// Threading: one check at a time per process (each uses the current device and the default
// stream, and synchronises before returning). Requires a CUDA device: call DeviceAvailable().
#ifndef LOOM_TESTS_GPU_OP_CHECKS_H_
#define LOOM_TESTS_GPU_OP_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/gemm_context.h"
#include "tests/gpu/bf16_bits.h"

namespace loom::gpu_check {

// Tolerances for ||out - ref|| / ||ref|| (DESIGN.md: bf16 operands between 1e-3 and 1e-2).
// One bf16 rounding of the output has an RMS relative error of about 1.1e-3.
inline constexpr double kTolBf16Store = 5e-3;  // elementwise ops: one rounding of the result
inline constexpr double kTolBf16Gemm = 1e-2;   // GEMM outputs, attention, chained roundings
inline constexpr double kTolFp32 = 1e-5;       // fp32 outputs from exact bf16 inputs
inline constexpr double kTolLoss = 1e-4;       // fp32 losses and log-sum-exps

// One compared output of one op.
struct Result {
  std::string op;      // e.g. "matmul_backward.dweight"
  std::string shape;   // e.g. "N=4096 C=768 OC=2304"
  double error = 0.0;  // ||out - ref|| / ||ref||; +inf for non-finite output
  double tolerance = 0.0;
  std::string note;                                // e.g. "reference on the first 64 rows"
  bool Pass() const { return error < tolerance; }  // false for NaN and Inf
};

// True when a CUDA device is usable; otherwise false with the reason in *why.
bool DeviceAvailable(std::string* why);

// ||out - ref|| / ||ref||: +inf when the sizes differ, out holds a non-finite value, or ref is
// all zeros (a degenerate check).
double RelativeError(const std::vector<double>& out, const std::vector<double>& ref);

// The checks. Each returns one Result per compared output; seed picks the random inputs.
std::vector<Result> CheckCast(long n, std::uint64_t seed);
std::vector<Result> CheckResidual(long n, std::uint64_t seed);
std::vector<Result> CheckGelu(long n, std::uint64_t seed);
std::vector<Result> CheckEncoder(int B, int T, int C, int V, std::uint64_t seed);
// layernorm forward, residual + layernorm forward, layernorm backward.
std::vector<Result> CheckLayerNorm(int N, int C, std::uint64_t seed);
// matmul forward (gelu: matmul_gelu_forward) at (N, C, OC); the reference covers the first
// min(N, ref_rows) rows of the output (rows are independent).
std::vector<Result> CheckMatmulForward(kernels::cuda::GemmContext& ctx, int N, int C, int OC,
                                       bool bias, bool gelu, int ref_rows, std::uint64_t seed);
// matmul backward at (N, C, OC), all outputs against the full reference.
std::vector<Result> CheckMatmulBackward(kernels::cuda::GemmContext& ctx, int N, int C, int OC,
                                        bool bias, std::uint64_t seed);
// attention forward and backward at (B, T, C, NH); the reference covers the first
// min(B, ref_batches) batch elements (they are independent).
std::vector<Result> CheckAttention(kernels::cuda::GemmContext& ctx, int B, int T, int C, int NH,
                                   int ref_batches, std::uint64_t seed);
// fused (flash) attention forward and backward at (B, T, C, NH), C / NH a supported head size:
// out, the log-sum-exp and the three parts of the qkv gradient against the same double
// reference as CheckAttention, on the first min(B, ref_batches) batch elements.
std::vector<Result> CheckFlashAttention(int B, int T, int C, int NH, int ref_batches,
                                        std::uint64_t seed);
// softmax + cross-entropy forward and backward over (N, V) logits with row stride Vp >= V; the
// reference covers the first min(N, ref_rows) rows.
std::vector<Result> CheckCrossEntropy(int N, int V, int Vp, int ref_rows, std::uint64_t seed);
std::vector<Result> CheckAdamW(long n, std::uint64_t seed);
std::vector<Result> CheckGradNorm(long n, std::uint64_t seed);

}  // namespace loom::gpu_check

#endif  // LOOM_TESTS_GPU_OP_CHECKS_H_
