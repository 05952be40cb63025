// Matmul with bias: reference against finite differences, fp32 (OpenBLAS) against reference.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ref/matmul_ref.h"
#include "tests/kernels/check.h"

namespace loom::kernels {
namespace {

using testutil::Added;
using testutil::Dot;
using testutil::kFiniteDifferenceTolerance;
using testutil::kFp32Tolerance;
using testutil::NumericalGradient;
using testutil::Poisoned;
using testutil::RandomDoubles;
using testutil::RandomFloats;
using testutil::RelativeError;
using testutil::ToDouble;

TEST(MatmulRef, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 5, OC = 7;
  std::mt19937 rng(31);
  std::vector<double> inp = RandomDoubles(rng, N * C), weight = RandomDoubles(rng, OC * C),
                      bias = RandomDoubles(rng, OC);
  const std::vector<double> dout = RandomDoubles(rng, N * OC);
  std::vector<double> out(N * OC);
  auto objective = [&] {
    ref::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return Dot(dout, out);
  };
  const std::vector<double> dinp0 = RandomDoubles(rng, N * C), dw0 = RandomDoubles(rng, OC * C),
                            db0 = RandomDoubles(rng, OC);
  std::vector<double> dinp = dinp0, dw = dw0, db = db0;
  ref::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), N,
                       C, OC);
  EXPECT_LT(RelativeError(Added(dinp, dinp0), NumericalGradient(inp, objective)),
            kFiniteDifferenceTolerance);
  EXPECT_LT(RelativeError(Added(dw, dw0), NumericalGradient(weight, objective)),
            kFiniteDifferenceTolerance);
  EXPECT_LT(RelativeError(Added(db, db0), NumericalGradient(bias, objective)),
            kFiniteDifferenceTolerance);
}

struct Shape {
  int N, C, OC;
};

void CheckAgainstReference(const Shape& s, bool with_bias) {
  SCOPED_TRACE(::testing::Message()
               << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
  const int N = s.N, C = s.C, OC = s.OC;
  std::mt19937 rng(32);
  const std::vector<float> inp = RandomFloats(rng, N * C), weight = RandomFloats(rng, OC * C),
                           bias = RandomFloats(rng, OC), dout = RandomFloats(rng, N * OC);
  const std::vector<float> dinp0 = RandomFloats(rng, N * C), dw0 = RandomFloats(rng, OC * C),
                           db0 = RandomFloats(rng, OC);
  const std::vector<double> inp_d = ToDouble(inp), w_d = ToDouble(weight), b_d = ToDouble(bias),
                            dout_d = ToDouble(dout);

  std::vector<float> out = Poisoned(N * OC);
  cpu::matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N,
                      C, OC);
  std::vector<double> out_r(N * OC);
  ref::matmul_forward(out_r.data(), inp_d.data(), w_d.data(), with_bias ? b_d.data() : nullptr, N,
                      C, OC);
  EXPECT_LT(RelativeError(out, out_r), kFp32Tolerance);

  std::vector<float> dinp = dinp0, dw = dw0, db = db0;
  cpu::matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                       inp.data(), weight.data(), N, C, OC);
  std::vector<double> dinp_r = ToDouble(dinp0), dw_r = ToDouble(dw0), db_r = ToDouble(db0);
  ref::matmul_backward(dinp_r.data(), dw_r.data(), with_bias ? db_r.data() : nullptr, dout_d.data(),
                       inp_d.data(), w_d.data(), N, C, OC);
  EXPECT_LT(RelativeError(dinp, dinp_r), kFp32Tolerance);
  EXPECT_LT(RelativeError(dw, dw_r), kFp32Tolerance);
  EXPECT_LT(RelativeError(db, db_r), kFp32Tolerance);  // untouched db0 when without bias
}

TEST(MatmulCpu, MatchesReference) {
  for (const Shape& s : {Shape{13, 19, 23}, Shape{9, 768, 2305}}) {
    CheckAgainstReference(s, /*with_bias=*/true);
    CheckAgainstReference(s, /*with_bias=*/false);
  }
}

TEST(MatmulCpu, NullDinpSkipsInputGradient) {
  const int N = 5, C = 7, OC = 3;
  std::mt19937 rng(33);
  const std::vector<float> inp = RandomFloats(rng, N * C), weight = RandomFloats(rng, OC * C),
                           dout = RandomFloats(rng, N * OC);
  std::vector<float> dw = RandomFloats(rng, OC * C);
  std::vector<double> dw_r = ToDouble(dw);
  cpu::matmul_backward(nullptr, dw.data(), nullptr, dout.data(), inp.data(), weight.data(), N, C,
                       OC);
  const std::vector<double> inp_d = ToDouble(inp), w_d = ToDouble(weight), dout_d = ToDouble(dout);
  ref::matmul_backward(nullptr, dw_r.data(), nullptr, dout_d.data(), inp_d.data(), w_d.data(), N, C,
                       OC);
  EXPECT_LT(RelativeError(dw, dw_r), kFp32Tolerance);
}

}  // namespace
}  // namespace loom::kernels
