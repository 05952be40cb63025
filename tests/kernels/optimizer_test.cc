// AdamW and the sum of squares (global gradient norm): fp32 against references, and the
// references against their defining formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/grad_norm.h"
#include "kernels/ref/adamw_ref.h"
#include "kernels/ref/grad_norm_ref.h"
#include "tests/kernels/check.h"

namespace loom::kernels {
namespace {

using testutil::kFp32Tolerance;
using testutil::RandomDoubles;
using testutil::RandomFloats;
using testutil::RelativeError;
using testutil::ToDouble;

TEST(AdamwRef, FirstStepFromZeroMomentsIsSignedStepPlusDecay) {
  // At t = 1 with m = v = 0: mhat = g and vhat = g^2, so the update is
  // p -= lr * (g / (|g| + eps) + wd * p), i.e. about lr * sign(g) plus the decoupled decay.
  const long n = 9;
  std::mt19937 rng(71);
  std::vector<double> p = RandomDoubles(rng, n), g = RandomDoubles(rng, n);
  const std::vector<double> p0 = p;
  std::vector<double> m(n, 0.0), v(n, 0.0);
  const double lr = 0.01, eps = 1e-8, wd = 0.1;
  ref::adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, 0.9, 0.95, eps, wd, 1);
  for (long i = 0; i < n; ++i) {
    const double expected = p0[i] - lr * (g[i] / (std::fabs(g[i]) + eps) + wd * p0[i]);
    EXPECT_NEAR(p[i], expected, 1e-12) << i;
    EXPECT_NEAR(m[i], 0.1 * g[i], 1e-15) << i;
    EXPECT_NEAR(v[i], 0.05 * g[i] * g[i], 1e-15) << i;
  }
}

TEST(AdamwCpu, MatchesReferenceOverSeveralSteps) {
  const long n = 1001;
  std::mt19937 rng(72);
  std::vector<float> p = RandomFloats(rng, n), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> p_r = ToDouble(p), m_r(n, 0.0), v_r(n, 0.0);
  const std::vector<double> p0 = p_r;
  // A large learning rate makes the update large beside p, so the comparison of the update
  // below is not drowned by the rounding of p itself.
  const float lr = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int t = 1; t <= 4; ++t) {
    const std::vector<float> g = RandomFloats(rng, n);
    const std::vector<double> g_d = ToDouble(g);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, wd, t);
    ref::adamw_update(p_r.data(), g_d.data(), m_r.data(), v_r.data(), n, lr, beta1, beta2, eps, wd,
                      t);
  }
  EXPECT_LT(RelativeError(m, m_r), kFp32Tolerance);
  EXPECT_LT(RelativeError(v, v_r), kFp32Tolerance);
  std::vector<double> delta(n), delta_r(n);
  for (long i = 0; i < n; ++i) {
    delta[i] = double{p[i]} - p0[i];
    delta_r[i] = p_r[i] - p0[i];
  }
  EXPECT_LT(RelativeError(delta, delta_r), kFp32Tolerance);
}

TEST(SumOfSquaresCpu, MatchesReference) {
  for (long n : {1L, 1001L, 100003L}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::mt19937 rng(73);
    const std::vector<float> x = RandomFloats(rng, n);
    const std::vector<double> x_d = ToDouble(x);
    const double got = cpu::sum_of_squares(x.data(), n);
    const double want = ref::sum_of_squares(x_d.data(), n);
    ASSERT_TRUE(std::isfinite(got));
    // Both sum the same squares in double; only the order differs.
    EXPECT_LT(std::fabs(got - want) / want, 1e-12);
  }
}

}  // namespace
}  // namespace loom::kernels
