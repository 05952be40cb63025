// Token + position embedding: reference against finite differences, fp32 against reference.
#include "kernels/encoder.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ref/encoder_ref.h"
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

struct Shape {
  int B, T, C, V, maxT;
};

TEST(EncoderRef, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 5, V = 7, maxT = 4;
  std::mt19937 rng(11);
  std::vector<int> tokens = RandomInts(rng, B * T, 0, V);
  tokens[1] = tokens[4];  // a repeated token must sum both contributions
  std::vector<double> wte = RandomDoubles(rng, V * C), wpe = RandomDoubles(rng, maxT * C);
  std::vector<double> dout = RandomDoubles(rng, B * T * C);
  std::vector<double> out(B * T * C);
  auto objective = [&] {
    ref::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(dout, out);
  };
  const std::vector<double> dwte0 = RandomDoubles(rng, V * C), dwpe0 = RandomDoubles(rng, maxT * C);
  std::vector<double> dwte = dwte0, dwpe = dwpe0;
  ref::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  EXPECT_LT(RelativeError(Added(dwte, dwte0), NumericalGradient(wte, objective)),
            kFiniteDifferenceTolerance);
  EXPECT_LT(RelativeError(Added(dwpe, dwpe0), NumericalGradient(wpe, objective)),
            kFiniteDifferenceTolerance);
}

TEST(EncoderCpu, MatchesReference) {
  for (const Shape& s : {Shape{3, 7, 19, 11, 9}, Shape{2, 5, 768, 37, 5}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const int N = s.B * s.T;
    std::mt19937 rng(12);
    const std::vector<int> tokens = RandomInts(rng, N, 0, s.V);
    const std::vector<float> wte = RandomFloats(rng, s.V * s.C);
    const std::vector<float> wpe = RandomFloats(rng, s.maxT * s.C);
    const std::vector<float> dout = RandomFloats(rng, N * s.C);
    const std::vector<float> dwte0 = RandomFloats(rng, s.V * s.C);
    const std::vector<float> dwpe0 = RandomFloats(rng, s.maxT * s.C);

    std::vector<float> out = Poisoned(N * s.C);
    cpu::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    std::vector<double> out_ref(N * s.C);
    const std::vector<double> wte_d = ToDouble(wte), wpe_d = ToDouble(wpe);
    ref::encoder_forward(out_ref.data(), tokens.data(), wte_d.data(), wpe_d.data(), s.B, s.T, s.C);
    EXPECT_LT(RelativeError(out, out_ref), kFp32Tolerance);

    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    std::vector<double> dwte_ref = ToDouble(dwte0), dwpe_ref = ToDouble(dwpe0);
    const std::vector<double> dout_d = ToDouble(dout);
    ref::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout_d.data(), tokens.data(), s.B, s.T,
                          s.C);
    EXPECT_LT(RelativeError(dwte, dwte_ref), kFp32Tolerance);
    EXPECT_LT(RelativeError(dwpe, dwpe_ref), kFp32Tolerance);
  }
}

TEST(EncoderCpuDeathTest, NegativeTokenExits) {
  const int B = 1, T = 2, C = 3;
  std::vector<int> tokens = {0, -1};
  std::vector<float> wte(2 * C, 1.0f), wpe(T * C, 1.0f), out(B * T * C);
  EXPECT_EXIT(cpu::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C),
              ::testing::ExitedWithCode(1), "encoder.cc:[0-9]+: .*non-negative");
}

}  // namespace
}  // namespace loom::kernels
