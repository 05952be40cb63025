// The CUDA backend (kernels/cuda/): its host-side launch arithmetic (always runs), and every op
// against the double-precision reference at small and odd shapes (skipped without a device).
// The op checks themselves live in tests/gpu/op_checks.{h,cc}, shared with loom-gpu-op-check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemm_context.h"
#include "kernels/cuda/gemm_shapes.h"
#include "kernels/cuda/launch.h"
#include "kernels/ref/attention_ref.h"
#include "kernels/ref/matmul_ref.h"
#include "tests/gpu/op_checks.h"

namespace loom::kernels::cuda {
namespace {

using gpu_check::Bf16BitsToFloat;
using gpu_check::FloatToBf16Bits;
using gpu_check::Result;

// ---- Host-side arithmetic: no device needed. ----

TEST(CudaLaunch, CeilDivAndGridBlocks) {
  EXPECT_EQ(launch::CeilDiv(0, 8), 0);
  EXPECT_EQ(launch::CeilDiv(1, 8), 1);
  EXPECT_EQ(launch::CeilDiv(16, 8), 2);
  EXPECT_EQ(launch::CeilDiv(17, 8), 3);
  EXPECT_EQ(launch::GridBlocks(0, 256), 1);  // an empty vector prefix still launches one block
  EXPECT_EQ(launch::GridBlocks(256, 256), 1);
  EXPECT_EQ(launch::GridBlocks(257, 256), 2);
  EXPECT_EQ(launch::GridBlocks(1L << 40, 256), launch::kMaxGridBlocks);  // grid-stride covers it
  // 124M: residual over B*T*C bf16 in 16-byte vectors.
  EXPECT_EQ(launch::GridBlocks(4L * 1024 * 768 / launch::kPack, launch::kBlock), 1536);
}

TEST(CudaLaunch, WarpRowBlocksGiveEveryRowAWarp) {
  for (long rows : {1L, 7L, 8L, 9L, 4096L, 12L * 1024}) {
    const int blocks = launch::WarpRowBlocks(rows, launch::kBlock);
    const long warps = static_cast<long>(blocks) * (launch::kBlock / launch::kWarpSize);
    EXPECT_GE(warps, rows) << rows;
    EXPECT_LT(warps - rows, launch::kBlock / launch::kWarpSize) << rows;  // no idle block
  }
}

TEST(CudaLaunch, AlignmentAndVectorWidth) {
  alignas(16) static const std::uint16_t buf[64] = {};
  const void* aligned = buf;
  const void* off2 = buf + 1;   // 2 bytes past a 16-byte boundary
  const void* off16 = buf + 8;  // 16 bytes past
  EXPECT_TRUE(launch::AllAligned16({aligned, off16, nullptr}));
  EXPECT_FALSE(launch::AllAligned16({aligned, off2}));
  EXPECT_EQ(launch::RowPackWidth(768, {aligned, off16}), launch::kPack);
  EXPECT_EQ(launch::RowPackWidth(72, {aligned}), launch::kPack);
  EXPECT_EQ(launch::RowPackWidth(45, {aligned}), 1);     // rows would start misaligned
  EXPECT_EQ(launch::RowPackWidth(50257, {aligned}), 1);  // unpadded vocabulary
  EXPECT_EQ(launch::RowPackWidth(50304, {aligned}), launch::kPack);
  EXPECT_EQ(launch::RowPackWidth(768, {aligned, off2}), 1);
  EXPECT_EQ(launch::VectorPrefix(0), 0);
  EXPECT_EQ(launch::VectorPrefix(7), 0);
  EXPECT_EQ(launch::VectorPrefix(8), 8);
  EXPECT_EQ(launch::VectorPrefix(1003), 1000);
}

TEST(CudaLaunch, PointerAlignmentIsTheLargestPowerOfTwoUpTo256) {
  auto at = [](std::uintptr_t a) { return reinterpret_cast<const void*>(a); };
  EXPECT_EQ(launch::PointerAlignment(nullptr), 256u);
  EXPECT_EQ(launch::PointerAlignment(at(0x10000)), 256u);
  EXPECT_EQ(launch::PointerAlignment(at(0x10080)), 128u);
  EXPECT_EQ(launch::PointerAlignment(at(0x10008)), 8u);
  EXPECT_EQ(launch::PointerAlignment(at(0x10002)), 2u);
  EXPECT_EQ(launch::PointerAlignment(at(0x10001)), 1u);
}

TEST(CudaLaunch, ColumnSumChunksFitTheScratch) {
  const size_t ws = launch::kMatmulWorkspaceBytes;
  EXPECT_EQ(launch::ColumnSumRowsPerChunk(4096, 2304, ws), launch::kColumnSumRows);
  // Wide outputs need longer chunks so the partials fit; check the invariant over a range.
  for (long N : {1L, 63L, 64L, 4096L, 16384L, 1L << 20}) {
    for (long cols : {1L, 101L, 768L, 3072L, 50304L, 1L << 20}) {
      const long rows = launch::ColumnSumRowsPerChunk(N, cols, ws);
      ASSERT_GE(rows, launch::kColumnSumRows) << N << " " << cols;
      const long chunks = launch::CeilDiv(N, rows);
      EXPECT_LE(static_cast<size_t>(chunks * cols) * sizeof(float), ws) << N << " " << cols;
      EXPECT_LE(chunks, 65535) << "grid.y limit";
    }
  }
  EXPECT_EQ(launch::ColumnSumRowsPerChunk(4096, ws, ws), 0);  // not even one chunk fits
  EXPECT_EQ(launch::LayerNormBackwardScratchFloats(4096, 768), 2L * 64 * 768);
  EXPECT_EQ(launch::LayerNormBackwardScratchFloats(65, 72), 2L * 2 * 72);
}

TEST(CudaLaunch, AttentionScratchLayout) {
  for (long T : {1L, 7L, 37L, 1024L}) {
    for (long NH : {1L, 3L, 12L}) {
      const size_t scores = launch::AttentionScoresBytes(T, NH);
      const size_t offset = launch::AttentionDscoresOffset(T, NH);
      EXPECT_EQ(scores, static_cast<size_t>(NH * T * T * 4));
      EXPECT_GE(offset, scores);
      EXPECT_LT(offset - scores, 256u);
      EXPECT_EQ(offset % 256, 0u);
      EXPECT_EQ(launch::AttentionScratchBytes(T, NH), offset + NH * T * T * 2);
    }
  }
}

TEST(CudaLaunch, CrossEntropyColumnBlocksCoverTheVocabulary) {
  for (long V : {1L, 101L, 2048L, 2049L, 50257L}) {
    const long per_block = static_cast<long>(launch::kBlock) * launch::kPack;
    const long blocks = launch::CrossEntropyColumnBlocks(V);
    EXPECT_GE(blocks * per_block, V) << V;
    EXPECT_LT((blocks - 1) * per_block, V) << V;
  }
}

TEST(CudaHostBf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): ties go to even.
  EXPECT_EQ(FloatToBf16Bits(1.0f + 0x1.0p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 and 0x3f82 (even).
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_EQ(FloatToBf16Bits(1.0f + 0x1.0p-8f + 0x1.0p-12f), 0x3f81);  // above halfway
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::nanf("")))));
  for (std::uint32_t b = 0; b < 0x7f80; b += 97) {  // finite positive bf16 values round-trip
    EXPECT_EQ(FloatToBf16Bits(Bf16BitsToFloat(static_cast<std::uint16_t>(b))), b);
  }
}

TEST(CudaHostCheck, RelativeErrorRejectsNaNAndDegenerateReferences) {
  EXPECT_DOUBLE_EQ(gpu_check::RelativeError({1.0, 2.0}, {1.0, 2.0}), 0.0);
  EXPECT_NEAR(gpu_check::RelativeError({3.0, 4.0}, {3.0, 4.5}), 0.5 / std::sqrt(9 + 20.25), 1e-15);
  EXPECT_FALSE(gpu_check::RelativeError({std::nan(""), 1.0}, {1.0, 1.0}) < 1.0);
  EXPECT_FALSE(gpu_check::RelativeError({0.0, 0.0}, {0.0, 0.0}) < 1.0);
  EXPECT_FALSE(gpu_check::RelativeError({1.0}, {1.0, 2.0}) < 1.0);
  Result r;
  r.error = std::numeric_limits<double>::quiet_NaN();
  r.tolerance = 1.0;
  EXPECT_FALSE(r.Pass());
}

// ---- The cuBLAS mapping of matmul and attention, replayed on the CPU. ----

// A column-major strided-batched GEMM exactly as cuBLAS defines it (alpha = 1), on doubles.
// Fails the test on any access outside the buffers (a_size, b_size, d_size elements) and on
// leading dimensions cuBLAS would reject.
void EmulateGemm(const launch::GemmShape& g, const std::vector<double>& a,
                 const std::vector<double>& b, std::vector<double>& d) {
  ASSERT_GE(g.lda, std::max(1, g.trans_a ? g.k : g.m));
  ASSERT_GE(g.ldb, std::max(1, g.trans_b ? g.n : g.k));
  ASSERT_GE(g.ldd, std::max(1, g.m));
  for (int batch = 0; batch < g.batch; ++batch) {
    const long a0 = g.a_offset + batch * g.stride_a;
    const long b0 = g.b_offset + batch * g.stride_b;
    const long d0 = g.d_offset + batch * g.stride_d;
    for (int j = 0; j < g.n; ++j) {
      for (int i = 0; i < g.m; ++i) {
        double acc = 0.0;
        for (int p = 0; p < g.k; ++p) {
          const long ai = a0 + (g.trans_a ? p + static_cast<long>(i) * g.lda
                                          : i + static_cast<long>(p) * g.lda);
          const long bi = b0 + (g.trans_b ? j + static_cast<long>(p) * g.ldb
                                          : p + static_cast<long>(j) * g.ldb);
          ASSERT_TRUE(ai >= 0 && ai < static_cast<long>(a.size())) << "A index " << ai;
          ASSERT_TRUE(bi >= 0 && bi < static_cast<long>(b.size())) << "B index " << bi;
          acc += a[ai] * b[bi];
        }
        const long di = d0 + i + static_cast<long>(j) * g.ldd;
        ASSERT_TRUE(di >= 0 && di < static_cast<long>(d.size())) << "D index " << di;
        d[di] = g.beta == 0.0f ? acc : acc + g.beta * d[di];
      }
    }
  }
}

std::vector<double> Uniform(std::mt19937& rng, long n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(CudaGemmShapes, MatmulMappingMatchesReference) {
  for (auto [N, C, OC] : {std::tuple{5, 3, 4}, std::tuple{7, 9, 2}, std::tuple{1, 16, 24}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " OC=" << OC);
    std::mt19937 rng(N * 100 + C * 10 + OC);
    const auto inp = Uniform(rng, static_cast<long>(N) * C, -1, 1);
    const auto w = Uniform(rng, static_cast<long>(OC) * C, -1, 1);
    const auto dout = Uniform(rng, static_cast<long>(N) * OC, -1, 1);
    std::vector<double> out(static_cast<long>(N) * OC, std::nan("")), out_r(out.size());
    EmulateGemm(launch::MatmulForwardShape(N, C, OC), w, inp, out);
    ref::matmul_forward(out_r.data(), inp.data(), w.data(), nullptr, N, C, OC);
    EXPECT_LT(MaxAbsDiff(out, out_r), 1e-12);
    // Backward accumulates onto non-zero start values.
    const auto dinp0 = Uniform(rng, static_cast<long>(N) * C, -1, 1);
    const auto dw0 = Uniform(rng, static_cast<long>(OC) * C, -1, 1);
    std::vector<double> dinp = dinp0, dw = dw0, dinp_r = dinp0, dw_r = dw0;
    EmulateGemm(launch::MatmulBackwardInputShape(N, C, OC), w, dout, dinp);
    EmulateGemm(launch::MatmulBackwardWeightShape(N, C, OC), inp, dout, dw);
    ref::matmul_backward(dinp_r.data(), dw_r.data(), nullptr, dout.data(), inp.data(), w.data(), N,
                         C, OC);
    EXPECT_LT(MaxAbsDiff(dinp, dinp_r), 1e-12);
    EXPECT_LT(MaxAbsDiff(dw, dw_r), 1e-12);
  }
}

// The attention launchers' sequence (attention.cu) with the kernels' formulas on the CPU.
TEST(CudaGemmShapes, AttentionMappingMatchesReference) {
  for (auto [B, T, C, NH] : {std::tuple{2, 5, 6, 2}, std::tuple{3, 7, 15, 5},
                             std::tuple{1, 1, 4, 1}, std::tuple{2, 9, 24, 3}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
    std::mt19937 rng(B * 1000 + T * 100 + C * 10 + NH);
    const int HS = C / NH;
    const long TT = static_cast<long>(T) * T;
    const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
    const auto qkv = Uniform(rng, static_cast<long>(B) * T * 3 * C, -1.5, 1.5);
    const auto dout = Uniform(rng, static_cast<long>(B) * T * C, -1, 1);
    std::vector<double> out(static_cast<long>(B) * T * C, std::nan(""));
    std::vector<double> att(B * NH * TT, std::nan("")), scores(NH * TT, std::nan(""));
    for (int b = 0; b < B; ++b) {
      EmulateGemm(launch::AttentionScoresShape(b, T, C, NH), qkv, qkv, scores);
      for (long r = 0; r < NH * T; ++r) {  // CausalSoftmaxKernel
        const int t = static_cast<int>(r % T);
        double maxv = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; ++j) maxv = std::max(maxv, scores[r * T + j] * scale);
        for (int j = 0; j <= t; ++j) sum += std::exp(scores[r * T + j] * scale - maxv);
        for (int j = 0; j < T; ++j) {
          att[b * NH * TT + r * T + j] =
              j <= t ? std::exp(scores[r * T + j] * scale - maxv) / sum : 0.0;
        }
      }
      EmulateGemm(launch::AttentionOutputShape(b, T, C, NH), qkv, att, out);
    }
    std::vector<double> out_r(out.size()), att_r(att.size());
    ref::attention_forward(out_r.data(), att_r.data(), qkv.data(), B, T, C, NH);
    EXPECT_LT(MaxAbsDiff(out, out_r), 1e-12);
    EXPECT_LT(MaxAbsDiff(att, att_r), 1e-12);

    const auto dqkv0 = Uniform(rng, static_cast<long>(B) * T * 3 * C, -1, 1);
    std::vector<double> dqkv = dqkv0, datt(NH * TT, std::nan("")), ds(NH * TT, std::nan(""));
    for (int b = 0; b < B; ++b) {
      EmulateGemm(launch::AttentionDattShape(b, T, C, NH), qkv, dout, datt);
      EmulateGemm(launch::AttentionDvShape(b, T, C, NH), dout, att, dqkv);
      for (long r = 0; r < NH * T; ++r) {  // CausalSoftmaxBackwardKernel
        const int t = static_cast<int>(r % T);
        const double* a = att.data() + b * NH * TT + r * T;
        double dot = 0.0;
        for (int j = 0; j <= t; ++j) dot += a[j] * datt[r * T + j];
        for (int j = 0; j < T; ++j) {
          ds[r * T + j] = j <= t ? scale * a[j] * (datt[r * T + j] - dot) : 0.0;
        }
      }
      EmulateGemm(launch::AttentionDqShape(b, T, C, NH), qkv, ds, dqkv);
      EmulateGemm(launch::AttentionDkShape(b, T, C, NH), qkv, ds, dqkv);
    }
    std::vector<double> dqkv_r = dqkv0, scratch_r(B * NH * TT);
    ref::attention_backward(dqkv_r.data(), scratch_r.data(), dout.data(), qkv.data(), att_r.data(),
                            B, T, C, NH);
    EXPECT_LT(MaxAbsDiff(dqkv, dqkv_r), 1e-12);
  }
}

// ---- Ops against the references: need a device. ----

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_check::DeviceAvailable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

void ExpectPass(const std::vector<Result>& results) {
  ASSERT_FALSE(results.empty());
  for (const Result& r : results) {
    EXPECT_LT(r.error, r.tolerance) << r.op << " [" << r.shape << "] " << r.note;
  }
}

TEST_F(CudaOps, Elementwise) {
  for (long n : {1L, 7L, 8L, 1005L}) {
    ExpectPass(gpu_check::CheckCast(n, 11 + n));
    ExpectPass(gpu_check::CheckResidual(n, 12 + n));
    ExpectPass(gpu_check::CheckGelu(n, 13 + n));
  }
}

TEST_F(CudaOps, Encoder) {
  ExpectPass(gpu_check::CheckEncoder(2, 7, 24, 50, 21));  // vector path (C % 8 == 0)
  ExpectPass(gpu_check::CheckEncoder(3, 5, 13, 11, 22));  // scalar path, many repeats
  ExpectPass(gpu_check::CheckEncoder(1, 1, 1, 1, 23));
}

TEST_F(CudaOps, LayerNorm) {
  ExpectPass(gpu_check::CheckLayerNorm(13, 72, 31));
  ExpectPass(gpu_check::CheckLayerNorm(9, 45, 32));
  ExpectPass(gpu_check::CheckLayerNorm(130, 768, 33));  // three row chunks in the backward
}

TEST_F(CudaOps, Matmul) {
  GemmContext ctx;
  ExpectPass(gpu_check::CheckMatmulForward(ctx, 21, 40, 24, true, false, 21, 41));
  ExpectPass(gpu_check::CheckMatmulForward(ctx, 21, 45, 37, false, false, 21, 42));
  ExpectPass(gpu_check::CheckMatmulForward(ctx, 21, 45, 37, true, false, 21, 43));
  ExpectPass(gpu_check::CheckMatmulForward(ctx, 21, 40, 64, true, true, 21, 44));
  ExpectPass(gpu_check::CheckMatmulForward(ctx, 21, 40, 36, true, true, 10, 45));  // unfused GELU
  ExpectPass(gpu_check::CheckMatmulBackward(ctx, 21, 40, 24, true, 46));
  ExpectPass(gpu_check::CheckMatmulBackward(ctx, 17, 45, 37, true, 47));
  ExpectPass(gpu_check::CheckMatmulBackward(ctx, 130, 16, 8, false, 48));
}

TEST_F(CudaOps, Attention) {
  GemmContext ctx;
  ExpectPass(gpu_check::CheckAttention(ctx, 2, 7, 18, 3, 2, 51));
  ExpectPass(gpu_check::CheckAttention(ctx, 3, 13, 15, 5, 3, 52));
  ExpectPass(gpu_check::CheckAttention(ctx, 2, 33, 64, 2, 1, 53));
  ExpectPass(gpu_check::CheckAttention(ctx, 1, 2, 8, 2, 1, 54));  // T=1 has dq = dk = 0
}

TEST_F(CudaOps, CrossEntropy) {
  ExpectPass(gpu_check::CheckCrossEntropy(11, 101, 104, 11, 61));
  ExpectPass(gpu_check::CheckCrossEntropy(7, 50, 50, 7, 62));
  ExpectPass(gpu_check::CheckCrossEntropy(5, 3000, 3008, 3, 63));
}

TEST_F(CudaOps, Optimizer) {
  ExpectPass(gpu_check::CheckAdamW(1001, 71));
  ExpectPass(gpu_check::CheckAdamW(4096, 72));
  ExpectPass(gpu_check::CheckGradNorm(100003, 73));
  ExpectPass(gpu_check::CheckGradNorm(5, 74));
}

}  // namespace
}  // namespace loom::kernels::cuda
