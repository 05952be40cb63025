// The CPU ops are bit-for-bit reproducible: two runs on the same inputs give identical bits, and
// the ops whose reductions are split by output element or fixed block (not by thread) give the
// same bits for any OpenMP thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/grad_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "tests/kernels/check.h"

namespace loom::kernels {
namespace {

using testutil::RandomFloats;
using testutil::RandomInts;

// Odd, non-trivial shapes; C divisible by NH.
constexpr int B = 3, T = 17, C = 90, NH = 5, V = 101, OC = 123;
constexpr int N = B * T;

// Every op, forward then backward, on fixed seeded inputs; all outputs and gradients appended
// to one byte string for comparison.
std::vector<float> RunAllOps() {
  std::mt19937 rng(81);
  std::vector<float> all;
  auto keep = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };

  const std::vector<int> tokens = RandomInts(rng, N, 0, V);
  const std::vector<float> wte = RandomFloats(rng, V * C), wpe = RandomFloats(rng, T * C);
  std::vector<float> x(N * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  cpu::encoder_forward(x.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  const std::vector<float> dx = RandomFloats(rng, N * C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dx.data(), tokens.data(), B, T, C);
  keep(x), keep(dwte), keep(dwpe);

  const std::vector<float> lw = RandomFloats(rng, C), lb = RandomFloats(rng, C);
  std::vector<float> ln(N * C), mean(N), rstd(N), dln(N * C, 0.0f), dlw(C, 0.0f), dlb(C, 0.0f);
  cpu::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(), N, C);
  cpu::layernorm_backward(dln.data(), dlw.data(), dlb.data(), dx.data(), x.data(), lw.data(),
                          mean.data(), rstd.data(), N, C);
  keep(ln), keep(mean), keep(rstd), keep(dln), keep(dlw), keep(dlb);

  const std::vector<float> w = RandomFloats(rng, 3 * C * C), bias = RandomFloats(rng, 3 * C);
  std::vector<float> qkv(N * 3 * C), dw(3 * C * C, 0.0f), dbias(3 * C, 0.0f), dinp(N * C, 0.0f);
  cpu::matmul_forward(qkv.data(), ln.data(), w.data(), bias.data(), N, C, 3 * C);
  const std::vector<float> dqkv_in = RandomFloats(rng, N * 3 * C);
  cpu::matmul_backward(dinp.data(), dw.data(), dbias.data(), dqkv_in.data(), ln.data(), w.data(), N,
                       C, 3 * C);
  keep(qkv), keep(dw), keep(dbias), keep(dinp);

  std::vector<float> att_out(N * C), att(B * NH * T * T), dqkv(N * 3 * C, 0.0f),
      scratch(B * NH * T * T);
  cpu::attention_forward(att_out.data(), att.data(), qkv.data(), B, T, C, NH);
  cpu::attention_backward(dqkv.data(), scratch.data(), dx.data(), qkv.data(), att.data(), B, T, C,
                          NH);
  keep(att_out), keep(att), keep(dqkv);

  std::vector<float> g(N * C), dg(N * C, 0.0f), r(N * C), da(N * C, 0.0f), db(N * C, 0.0f);
  cpu::gelu_forward(g.data(), att_out.data(), N * C);
  cpu::gelu_backward(dg.data(), att_out.data(), dx.data(), N * C);
  cpu::residual_forward(r.data(), g.data(), x.data(), N * C);
  cpu::residual_backward(da.data(), db.data(), dx.data(), N * C);
  keep(g), keep(dg), keep(r), keep(da), keep(db);

  const std::vector<int> targets = RandomInts(rng, N, 0, OC);
  const std::vector<float> hw = RandomFloats(rng, OC * C);
  std::vector<float> logits(N * OC), losses(N), probs(N * OC), dlogits(N * OC, 0.0f);
  cpu::matmul_forward(logits.data(), r.data(), hw.data(), nullptr, N, C, OC);
  cpu::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N,
                                    OC);
  const std::vector<float> dlosses(N, 1.0f / N);
  cpu::softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dlosses.data(),
                                     N, OC);
  keep(logits), keep(losses), keep(probs), keep(dlogits);

  std::vector<float> m(dw.size(), 0.0f), v(dw.size(), 0.0f), p = w;
  cpu::adamw_update(p.data(), dw.data(), m.data(), v.data(), static_cast<long>(p.size()), 1e-3f,
                    0.9f, 0.95f, 1e-8f, 0.1f, 1);
  keep(p), keep(m), keep(v);
  const double ss = cpu::sum_of_squares(all.data(), static_cast<long>(all.size()));
  all.push_back(static_cast<float>(ss));
  float hi_lo[2];
  std::memcpy(hi_lo, &ss, sizeof(ss));  // all 64 bits of the double, not only a float rounding
  all.push_back(hi_lo[0]), all.push_back(hi_lo[1]);
  return all;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CpuDeterminism, TwoRunsAreBitForBitEqual) {
  const std::vector<float> first = RunAllOps();
  const std::vector<float> second = RunAllOps();
  EXPECT_TRUE(SameBits(first, second));
}

TEST(CpuDeterminism, AttentionWithThreadedGemmsIsReproducible) {
  // T*T*HS = 129*129*33 is above OpenBLAS's single-thread threshold: nested BLAS threads.
  const int b = 2, t = 129, c = 66, nh = 2;
  std::mt19937 rng(83);
  const std::vector<float> qkv = RandomFloats(rng, b * t * 3 * c),
                           dy = RandomFloats(rng, b * t * c);
  auto run = [&] {
    std::vector<float> out(b * t * c), att(b * nh * t * t), scratch(att.size()), dqkv(qkv.size());
    cpu::attention_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
    cpu::attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), att.data(), b, t, c,
                            nh);
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  EXPECT_TRUE(SameBits(run(), run()));
}

// Runs fn under 1 and under 3 OpenMP threads and expects identical bits; restores the setting.
void ExpectThreadCountIndependent(const std::function<std::vector<float>()>& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = fn();
  omp_set_num_threads(3);
  const std::vector<float> three = fn();
  omp_set_num_threads(saved);
  EXPECT_TRUE(SameBits(one, three));
}

TEST(CpuDeterminism, RowReductionsDoNotDependOnThreadCount) {
  std::mt19937 rng(82);
  const int n = 37, c = 203;  // several channel chunks
  const std::vector<float> x = RandomFloats(rng, n * c), dy = RandomFloats(rng, n * c),
                           w = RandomFloats(rng, c), b = RandomFloats(rng, c);
  ExpectThreadCountIndependent([&] {
    std::vector<float> y(n * c), mean(n), rstd(n), dx(n * c, 0.0f), dw(c, 0.0f), db(c, 0.0f);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), n, c);
    std::vector<float> all = y;
    all.insert(all.end(), dx.begin(), dx.end());
    all.insert(all.end(), dw.begin(), dw.end());
    all.insert(all.end(), db.begin(), db.end());
    return all;
  });
  const std::vector<int> tokens = RandomInts(rng, n, 0, 5);  // many repeats
  ExpectThreadCountIndependent([&] {
    std::vector<float> dwte(5 * c, 0.0f), dwpe(n * c, 0.0f);
    cpu::encoder_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), 1, n, c);
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  });
  const std::vector<float> big = RandomFloats(rng, 100003);
  ExpectThreadCountIndependent([&] {
    const double ss = cpu::sum_of_squares(big.data(), static_cast<long>(big.size()));
    float bits[2];
    std::memcpy(bits, &ss, sizeof(ss));
    return std::vector<float>{bits[0], bits[1]};
  });
}

}  // namespace
}  // namespace loom::kernels
