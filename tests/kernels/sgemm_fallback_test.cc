// The built-in fallback GEMM (kernels/cpu/sgemm_fallback.h), called directly: it is what the CPU
// ops run on machines without a BLAS library (the GPU machine), and a build with OpenBLAS never
// reaches it through the ops, so it is tested here on every machine. Shapes cross the fallback's
// tile and block sizes (6 x 8 registers, 96 x 256 tiles, K blocks of 256) at odd remainders.
#include "kernels/cpu/sgemm_fallback.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/ref/matmul_ref.h"
#include "tests/kernels/check.h"

namespace loom::kernels {
namespace {

using testutil::kFp32Tolerance;
using testutil::Poisoned;
using testutil::RandomFloats;
using testutil::RelativeError;
using testutil::ToDouble;

struct MatmulShape {
  int N, C, OC;
};

// The three GEMMs of matmul_forward / matmul_backward, issued as kernels/cpu/matmul.cc issues
// them to cblas_sgemm, against the double reference of the layer.
TEST(SgemmFallback, MatmulGemmsMatchReference) {
  for (const MatmulShape& s : {MatmulShape{1, 1, 1}, MatmulShape{7, 13, 5}, MatmulShape{37, 97, 61},
                               MatmulShape{263, 300, 517}, MatmulShape{101, 613, 9}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const int N = s.N, C = s.C, OC = s.OC;
    std::mt19937 rng(41);
    const std::vector<float> inp = RandomFloats(rng, static_cast<long>(N) * C),
                             weight = RandomFloats(rng, static_cast<long>(OC) * C),
                             bias = RandomFloats(rng, OC),
                             dout = RandomFloats(rng, static_cast<long>(N) * OC),
                             dinp0 = RandomFloats(rng, static_cast<long>(N) * C),
                             dw0 = RandomFloats(rng, static_cast<long>(OC) * C);
    const std::vector<double> inp_d = ToDouble(inp), w_d = ToDouble(weight), b_d = ToDouble(bias),
                              dout_d = ToDouble(dout);

    // out (N,OC) = inp (N,C) @ weight (OC,C)^T, beta = 0 into a poisoned buffer.
    std::vector<float> out = Poisoned(static_cast<long>(N) * OC);
    cpu::sgemm_fallback(false, true, N, OC, C, 1.0f, inp.data(), C, weight.data(), C, 0.0f,
                        out.data(), OC);
    std::vector<double> out_r(static_cast<size_t>(N) * OC);
    ref::matmul_forward(out_r.data(), inp_d.data(), w_d.data(), nullptr, N, C, OC);
    const double e_out = RelativeError(out, out_r);
    EXPECT_LT(e_out, kFp32Tolerance);

    // The same with the bias broadcast into out first and beta = 1.
    std::vector<float> out_b(static_cast<size_t>(N) * OC);
    for (int n = 0; n < N; ++n)
      std::memcpy(&out_b[static_cast<size_t>(n) * OC], bias.data(), OC * 4);
    cpu::sgemm_fallback(false, true, N, OC, C, 1.0f, inp.data(), C, weight.data(), C, 1.0f,
                        out_b.data(), OC);
    ref::matmul_forward(out_r.data(), inp_d.data(), w_d.data(), b_d.data(), N, C, OC);
    EXPECT_LT(RelativeError(out_b, out_r), kFp32Tolerance);

    // dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp (N,C).
    std::vector<float> dinp = dinp0, dw = dw0;
    cpu::sgemm_fallback(false, false, N, C, OC, 1.0f, dout.data(), OC, weight.data(), C, 1.0f,
                        dinp.data(), C);
    cpu::sgemm_fallback(true, false, OC, C, N, 1.0f, dout.data(), OC, inp.data(), C, 1.0f,
                        dw.data(), C);
    std::vector<double> dinp_r = ToDouble(dinp0), dw_r = ToDouble(dw0);
    ref::matmul_backward(dinp_r.data(), dw_r.data(), nullptr, dout_d.data(), inp_d.data(),
                         w_d.data(), N, C, OC);
    const double e_dinp = RelativeError(dinp, dinp_r), e_dw = RelativeError(dw, dw_r);
    EXPECT_LT(e_dinp, kFp32Tolerance);
    EXPECT_LT(e_dw, kFp32Tolerance);
  }
}

// C (M,N) = alpha op(A) op(B) + beta C in double, row-major, with leading dimensions.
std::vector<double> GemmRef(bool ta, bool tb, int M, int N, int K, double alpha,
                            const std::vector<float>& A, int lda, const std::vector<float>& B,
                            int ldb, double beta, const std::vector<float>& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int p = 0; p < K; ++p) {
        const double a =
            ta ? A[static_cast<size_t>(p) * lda + i] : A[static_cast<size_t>(i) * lda + p];
        const double b =
            tb ? B[static_cast<size_t>(j) * ldb + p] : B[static_cast<size_t>(p) * ldb + j];
        s += a * b;
      }
      double& c = out[static_cast<size_t>(i) * ldc + j];
      c = alpha * s + (beta == 0.0 ? 0.0 : beta * c);
    }
  }
  return out;
}

// Every transpose combination, alpha and beta other than 1, and padded leading dimensions (as
// attention's strided Q/K/V views use): elements outside the M x N window must stay untouched.
TEST(SgemmFallback, GeneralMatchesReference) {
  struct Case {
    int M, N, K;
  };
  for (const Case& s : {Case{1, 9, 3}, Case{13, 7, 1}, Case{100, 530, 300}, Case{97, 17, 515}}) {
    for (int t = 0; t < 4; ++t) {
      for (const float beta : {0.0f, -1.5f}) {
        const bool ta = t & 1, tb = t & 2;
        SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K
                                          << " ta=" << ta << " tb=" << tb << " beta=" << beta);
        const int M = s.M, N = s.N, K = s.K;
        const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
        std::mt19937 rng(43 + t);
        const std::vector<float> A = RandomFloats(rng, static_cast<long>(ta ? K : M) * lda);
        const std::vector<float> B = RandomFloats(rng, static_cast<long>(tb ? N : K) * ldb);
        // beta = 0: C starts as NaN and must not leak; otherwise random.
        std::vector<float> C = beta == 0.0f ? Poisoned(static_cast<long>(M) * ldc)
                                            : RandomFloats(rng, static_cast<long>(M) * ldc);
        // The padding columns keep a sentinel the GEMM must not touch.
        for (int i = 0; i < M; ++i) {
          C[static_cast<size_t>(i) * ldc + N] = 7.0f;
          C[static_cast<size_t>(i) * ldc + N + 1] = 7.0f;
        }
        std::vector<double> ref = GemmRef(ta, tb, M, N, K, 0.37, A, lda, B, ldb, beta, C, ldc);
        for (int i = 0; i < M; ++i)
          ref[static_cast<size_t>(i) * ldc + N] = ref[static_cast<size_t>(i) * ldc + N + 1] = 7.0;
        cpu::sgemm_fallback(ta, tb, M, N, K, 0.37f, A.data(), lda, B.data(), ldb, beta, C.data(),
                            ldc);
        EXPECT_LT(RelativeError(C, ref), kFp32Tolerance);
        for (int i = 0; i < M; ++i) {
          ASSERT_EQ(C[static_cast<size_t>(i) * ldc + N], 7.0f) << "row " << i;
          ASSERT_EQ(C[static_cast<size_t>(i) * ldc + N + 1], 7.0f) << "row " << i;
        }
      }
    }
  }
}

// K = 0 (or alpha = 0) only scales C by beta; beta = 0 then writes zeros over anything.
TEST(SgemmFallback, EmptyInnerDimensionScalesC) {
  std::vector<float> C = {1.0f, -2.0f, 3.0f, 4.0f};
  cpu::sgemm_fallback(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
  std::vector<float> P = Poisoned(4);
  cpu::sgemm_fallback(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, P.data(), 2);
  EXPECT_EQ(P, (std::vector<float>(4, 0.0f)));
}

#ifdef _OPENMP
// Tiles are fixed by the shape and each element's sum over K stays on one thread: the same bits
// under 1 and 3 threads.
TEST(SgemmFallback, SameBitsForAnyThreadCount) {
  const int M = 301, N = 1100, K = 530;
  std::mt19937 rng(47);
  const std::vector<float> A = RandomFloats(rng, static_cast<long>(M) * K),
                           B = RandomFloats(rng, static_cast<long>(K) * N);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> C = Poisoned(static_cast<long>(M) * N);
    cpu::sgemm_fallback(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    omp_set_num_threads(saved);
    return C;
  };
  const std::vector<float> one = run(1), three = run(3);
  EXPECT_EQ(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)), 0);
}
#endif

}  // namespace
}  // namespace loom::kernels
