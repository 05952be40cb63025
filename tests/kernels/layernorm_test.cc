// Layernorm: reference against finite differences, fp32 against reference.
#include "kernels/layernorm.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ref/layernorm_ref.h"
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

TEST(LayernormRef, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 7;
  std::mt19937 rng(21);
  std::vector<double> inp = RandomDoubles(rng, N * C, -2.0, 2.0);
  std::vector<double> weight = RandomDoubles(rng, C), bias = RandomDoubles(rng, C);
  const std::vector<double> dout = RandomDoubles(rng, N * C);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto objective = [&] {
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                           bias.data(), N, C);
    return Dot(dout, out);
  };
  objective();  // fills mean and rstd at the unperturbed point
  const std::vector<double> saved_mean = mean, saved_rstd = rstd;
  const std::vector<double> dinp0 = RandomDoubles(rng, N * C), dw0 = RandomDoubles(rng, C),
                            db0 = RandomDoubles(rng, C);
  std::vector<double> dinp = dinp0, dw = dw0, db = db0;
  ref::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(),
                          saved_mean.data(), saved_rstd.data(), N, C);
  EXPECT_LT(RelativeError(Added(dinp, dinp0), NumericalGradient(inp, objective)),
            kFiniteDifferenceTolerance);
  EXPECT_LT(RelativeError(Added(dw, dw0), NumericalGradient(weight, objective)),
            kFiniteDifferenceTolerance);
  EXPECT_LT(RelativeError(Added(db, db0), NumericalGradient(bias, objective)),
            kFiniteDifferenceTolerance);
}

TEST(LayernormCpu, MatchesReference) {
  struct Shape {
    int N, C;
  };
  for (const Shape& s : {Shape{13, 37}, Shape{9, 768}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const int N = s.N, C = s.C;
    std::mt19937 rng(22);
    // An offset mean exercises the two-pass variance.
    const std::vector<float> inp = RandomFloats(rng, N * C, 0.5f, 3.0f);
    const std::vector<float> weight = RandomFloats(rng, C), bias = RandomFloats(rng, C);
    const std::vector<float> dout = RandomFloats(rng, N * C);
    const std::vector<float> dinp0 = RandomFloats(rng, N * C), dw0 = RandomFloats(rng, C),
                             db0 = RandomFloats(rng, C);

    std::vector<float> out = Poisoned(N * C), mean = Poisoned(N), rstd = Poisoned(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                           bias.data(), N, C);
    const std::vector<double> inp_d = ToDouble(inp), w_d = ToDouble(weight), b_d = ToDouble(bias);
    std::vector<double> out_r(N * C), mean_r(N), rstd_r(N);
    ref::layernorm_forward(out_r.data(), mean_r.data(), rstd_r.data(), inp_d.data(), w_d.data(),
                           b_d.data(), N, C);
    EXPECT_LT(RelativeError(out, out_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(mean, mean_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(rstd, rstd_r), kFp32Tolerance);

    std::vector<float> dinp = dinp0, dw = dw0, db = db0;
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                            weight.data(), mean.data(), rstd.data(), N, C);
    std::vector<double> dinp_r = ToDouble(dinp0), dw_r = ToDouble(dw0), db_r = ToDouble(db0);
    const std::vector<double> dout_d = ToDouble(dout);
    ref::layernorm_backward(dinp_r.data(), dw_r.data(), db_r.data(), dout_d.data(), inp_d.data(),
                            w_d.data(), mean_r.data(), rstd_r.data(), N, C);
    EXPECT_LT(RelativeError(dinp, dinp_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(dw, dw_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(db, db_r), kFp32Tolerance);
  }
}

}  // namespace
}  // namespace loom::kernels
