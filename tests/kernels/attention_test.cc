// Causal self-attention: reference against finite differences, fp32 against reference.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ref/attention_ref.h"
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

TEST(AttentionRef, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 4, C = 6, NH = 2;
  std::mt19937 rng(51);
  std::vector<double> qkv = RandomDoubles(rng, B * T * 3 * C, -1.5, 1.5);
  const std::vector<double> dout = RandomDoubles(rng, B * T * C);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  auto objective = [&] {
    ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return Dot(dout, out);
  };
  objective();
  const std::vector<double> saved_att = att;
  const std::vector<double> dqkv0 = RandomDoubles(rng, B * T * 3 * C);
  std::vector<double> dqkv = dqkv0, scratch(B * NH * T * T);
  ref::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), saved_att.data(), B,
                          T, C, NH);
  EXPECT_LT(RelativeError(Added(dqkv, dqkv0), NumericalGradient(qkv, objective)),
            kFiniteDifferenceTolerance);
}

TEST(AttentionRef, IsCausal) {
  // Changing the last token's q, k and v must leave every earlier output unchanged.
  const int B = 1, T = 5, C = 6, NH = 3;
  std::mt19937 rng(52);
  std::vector<double> qkv = RandomDoubles(rng, B * T * 3 * C);
  std::vector<double> out1(B * T * C), out2(B * T * C), att(B * NH * T * T);
  ref::attention_forward(out1.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < 3 * C; ++i) qkv[(T - 1) * 3 * C + i] += 0.5;
  ref::attention_forward(out2.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < (T - 1) * C; ++i) EXPECT_EQ(out1[i], out2[i]) << i;
  bool last_changed = false;
  for (int i = (T - 1) * C; i < T * C; ++i) last_changed |= out1[i] != out2[i];
  EXPECT_TRUE(last_changed);
}

TEST(AttentionCpu, MatchesReference) {
  struct Shape {
    int B, T, C, NH;
  };
  // The last shape has T*T*HS above OpenBLAS's single-thread threshold (2^18), so its GEMMs run
  // threaded inside the OpenMP threads.
  for (const Shape& s :
       {Shape{2, 7, 18, 3}, Shape{3, 13, 15, 5}, Shape{1, 33, 768, 12}, Shape{1, 129, 66, 2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    std::mt19937 rng(53);
    const std::vector<float> qkv = RandomFloats(rng, B * T * 3 * C, -1.5f, 1.5f);
    const std::vector<float> dout = RandomFloats(rng, B * T * C);
    const std::vector<float> dqkv0 = RandomFloats(rng, B * T * 3 * C);
    std::vector<float> out = Poisoned(B * T * C), att = Poisoned(B * NH * T * T);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    const std::vector<double> qkv_d = ToDouble(qkv), dout_d = ToDouble(dout);
    std::vector<double> out_r(B * T * C), att_r(B * NH * T * T);
    ref::attention_forward(out_r.data(), att_r.data(), qkv_d.data(), B, T, C, NH);
    EXPECT_LT(RelativeError(out, out_r), kFp32Tolerance);
    EXPECT_LT(RelativeError(att, att_r), kFp32Tolerance);

    std::vector<float> dqkv = dqkv0, scratch = Poisoned(B * NH * T * T);
    cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T,
                            C, NH);
    std::vector<double> dqkv_r = ToDouble(dqkv0), scratch_r(B * NH * T * T);
    ref::attention_backward(dqkv_r.data(), scratch_r.data(), dout_d.data(), qkv_d.data(),
                            att_r.data(), B, T, C, NH);
    EXPECT_LT(RelativeError(dqkv, dqkv_r), kFp32Tolerance);
  }
}

TEST(AttentionCpuDeathTest, HeadsMustDivideChannels) {
  const int B = 1, T = 2, C = 10, NH = 3;
  std::vector<float> qkv(B * T * 3 * C, 1.0f), out(B * T * C), att(B * NH * T * T);
  EXPECT_EXIT(cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH),
              ::testing::ExitedWithCode(1), "attention.cc:[0-9]+: .*divisible by NH");
}

}  // namespace
}  // namespace loom::kernels
