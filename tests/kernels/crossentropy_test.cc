// Fused softmax + cross-entropy: reference against finite differences, fp32 against reference.
#include "kernels/crossentropy.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ref/crossentropy_ref.h"
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
using testutil::RandomInts;
using testutil::RelativeError;
using testutil::ToDouble;

TEST(CrossentropyRef, BackwardMatchesFiniteDifferences) {
  const int N = 3, V = 7;
  std::mt19937 rng(61);
  std::vector<double> logits = RandomDoubles(rng, N * V, -3.0, 3.0);
  const std::vector<int> targets = RandomInts(rng, N, 0, V);
  const std::vector<double> dlosses = RandomDoubles(rng, N);
  std::vector<double> losses(N), probs(N * V);
  auto objective = [&] {
    ref::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N,
                                      V);
    return Dot(dlosses, losses);
  };
  objective();
  const std::vector<double> saved_probs = probs;
  const std::vector<double> dlogits0 = RandomDoubles(rng, N * V);
  std::vector<double> dlogits = dlogits0;
  ref::softmax_crossentropy_backward(dlogits.data(), saved_probs.data(), targets.data(),
                                     dlosses.data(), N, V);
  EXPECT_LT(RelativeError(Added(dlogits, dlogits0), NumericalGradient(logits, objective)),
            kFiniteDifferenceTolerance);
}

TEST(CrossentropyRef, UniformLogitsGiveLogV) {
  const int N = 2, V = 11;
  std::vector<double> logits(N * V, 0.75), losses(N), probs(N * V);
  const std::vector<int> targets = {3, 10};
  ref::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N,
                                    V);
  EXPECT_NEAR(losses[0], std::log(double{V}), 1e-12);
  EXPECT_NEAR(losses[1], std::log(double{V}), 1e-12);
}

TEST(CrossentropyCpu, MatchesReference) {
  struct Shape {
    int N, V;
  };
  for (const Shape& s : {Shape{7, 37}, Shape{5, 50257}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V);
    const int N = s.N, V = s.V;
    std::mt19937 rng(62);
    const std::vector<float> logits = RandomFloats(rng, N * V, -4.0f, 4.0f);
    const std::vector<int> targets = RandomInts(rng, N, 0, V);
    const std::vector<float> dlosses = RandomFloats(rng, N);
    const std::vector<float> dlogits0 = RandomFloats(rng, N * V, -1e-4f, 1e-4f);
    std::vector<float> losses = Poisoned(N), probs = Poisoned(N * V);
    cpu::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N,
                                      V);
    const std::vector<double> logits_d = ToDouble(logits), dlosses_d = ToDouble(dlosses);
    std::vector<double> losses_r(N), probs_r(N * V);
    ref::softmax_crossentropy_forward(losses_r.data(), probs_r.data(), logits_d.data(),
                                      targets.data(), N, V);
    EXPECT_LT(RelativeError(losses, losses_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(probs, probs_r), kFp32Tolerance);

    // dlogits0 is small because with V = 50257 the gradient per element is tiny (about 1/V);
    // larger initial values would hide it in the relative error.
    std::vector<float> dlogits = dlogits0;
    cpu::softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dlosses.data(),
                                       N, V);
    std::vector<double> dlogits_r = ToDouble(dlogits0);
    ref::softmax_crossentropy_backward(dlogits_r.data(), probs_r.data(), targets.data(),
                                       dlosses_d.data(), N, V);
    EXPECT_LT(RelativeError(dlogits, dlogits_r), kFp32Tolerance);
  }
}

TEST(CrossentropyCpuDeathTest, TargetOutOfRangeExits) {
  const int N = 1, V = 4;
  std::vector<float> logits(V, 0.0f), probs(V), losses(N);
  const std::vector<int> targets = {V};
  EXPECT_EXIT(cpu::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(),
                                                targets.data(), N, V),
              ::testing::ExitedWithCode(1), "crossentropy.cc:[0-9]+: .*out of range");
}

}  // namespace
}  // namespace loom::kernels
