// GELU and residual add: references against finite differences, fp32 against references.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/gelu.h"
#include "kernels/ref/gelu_ref.h"
#include "kernels/ref/residual_ref.h"
#include "kernels/residual.h"
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

TEST(GeluRef, BackwardMatchesFiniteDifferences) {
  const long n = 41;
  std::mt19937 rng(41);
  std::vector<double> inp = RandomDoubles(rng, n, -4.0, 4.0);
  const std::vector<double> dout = RandomDoubles(rng, n);
  std::vector<double> out(n);
  auto objective = [&] {
    ref::gelu_forward(out.data(), inp.data(), n);
    return Dot(dout, out);
  };
  const std::vector<double> dinp0 = RandomDoubles(rng, n);
  std::vector<double> dinp = dinp0;
  ref::gelu_backward(dinp.data(), inp.data(), dout.data(), n);
  EXPECT_LT(RelativeError(Added(dinp, dinp0), NumericalGradient(inp, objective)),
            kFiniteDifferenceTolerance);
}

TEST(GeluRef, MatchesExactGeluClosely) {
  // The tanh form approximates x * Phi(x) to within about 1e-3 absolute: a check that the
  // constants in the reference are the GPT-2 ones, independent of the fp32 code.
  for (double x = -5.0; x <= 5.0; x += 0.37) {
    double out = 0.0;
    ref::gelu_forward(&out, &x, 1);
    const double exact = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    EXPECT_NEAR(out, exact, 1e-3) << "x=" << x;
  }
}

TEST(GeluCpu, MatchesReference) {
  for (long n : {1001L, 9L * 3073L}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::mt19937 rng(42);
    const std::vector<float> inp = RandomFloats(rng, n, -5.0f, 5.0f), dout = RandomFloats(rng, n);
    const std::vector<float> dinp0 = RandomFloats(rng, n);
    std::vector<float> out = Poisoned(n);
    cpu::gelu_forward(out.data(), inp.data(), n);
    const std::vector<double> inp_d = ToDouble(inp), dout_d = ToDouble(dout);
    std::vector<double> out_r(n);
    ref::gelu_forward(out_r.data(), inp_d.data(), n);
    EXPECT_LT(RelativeError(out, out_r), kFp32Tolerance);

    std::vector<float> dinp = dinp0;
    cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), n);
    std::vector<double> dinp_r = ToDouble(dinp0);
    ref::gelu_backward(dinp_r.data(), inp_d.data(), dout_d.data(), n);
    EXPECT_LT(RelativeError(dinp, dinp_r), kFp32Tolerance);
  }
}

TEST(ResidualRef, BackwardMatchesFiniteDifferences) {
  const long n = 17;
  std::mt19937 rng(43);
  std::vector<double> a = RandomDoubles(rng, n), b = RandomDoubles(rng, n);
  const std::vector<double> dout = RandomDoubles(rng, n);
  std::vector<double> out(n);
  auto objective = [&] {
    ref::residual_forward(out.data(), a.data(), b.data(), n);
    return Dot(dout, out);
  };
  const std::vector<double> da0 = RandomDoubles(rng, n), db0 = RandomDoubles(rng, n);
  std::vector<double> da = da0, db = db0;
  ref::residual_backward(da.data(), db.data(), dout.data(), n);
  EXPECT_LT(RelativeError(Added(da, da0), NumericalGradient(a, objective)),
            kFiniteDifferenceTolerance);
  EXPECT_LT(RelativeError(Added(db, db0), NumericalGradient(b, objective)),
            kFiniteDifferenceTolerance);
}

TEST(ResidualCpu, MatchesReference) {
  for (long n : {1001L, 9L * 769L}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::mt19937 rng(44);
    const std::vector<float> a = RandomFloats(rng, n), b = RandomFloats(rng, n),
                             dout = RandomFloats(rng, n);
    const std::vector<float> da0 = RandomFloats(rng, n), db0 = RandomFloats(rng, n);
    std::vector<float> out = Poisoned(n);
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    const std::vector<double> a_d = ToDouble(a), b_d = ToDouble(b), dout_d = ToDouble(dout);
    std::vector<double> out_r(n);
    ref::residual_forward(out_r.data(), a_d.data(), b_d.data(), n);
    EXPECT_LT(RelativeError(out, out_r), kFp32Tolerance);

    std::vector<float> da = da0, db = db0;
    cpu::residual_backward(da.data(), db.data(), dout.data(), n);
    std::vector<double> da_r = ToDouble(da0), db_r = ToDouble(db0);
    ref::residual_backward(da_r.data(), db_r.data(), dout_d.data(), n);
    EXPECT_LT(RelativeError(da, da_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(db, db_r), kFp32Tolerance);
  }
}

}  // namespace
}  // namespace loom::kernels
