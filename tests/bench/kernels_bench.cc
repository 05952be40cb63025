// CPU op microbenchmarks at gpt2-124m shapes (B=4, T=64, C=768, NH=12; 4C = 3072 for the MLP),
// each reporting a FLOPS counter (floating-point operations per second), beside a large square
// cblas_sgemm that measures the machine's sgemm peak, so an op can be quoted as a fraction of it.
//
// Run (median of repetitions; passive OpenMP waiting, see kernels/README.md):
//   OMP_WAIT_POLICY=passive kernels_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
//
// FLOP counts: a GEMM of (M,K) x (K,N) is 2MNK. Attention counts the GEMMs as executed (the full
// T x T score matrix, not only its causal half). Layernorm is memory-bound; its count (about 8
// operations per element forward, 14 backward) is given for comparison and bytes/s alongside.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"

namespace {

namespace cpu = loom::kernels::cpu;

constexpr int kB = 4, kT = 64, kC = 768, kNH = 12;
constexpr int kN = kB * kT;

std::vector<float> Random(long n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void SetFlops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOPS"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// Square sgemm, M = N = K = range(0): the reference peak.
void BM_SgemmPeak(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::vector<float> a = Random(static_cast<long>(n) * n, 1),
                           b = Random(static_cast<long>(n) * n, 2);
  std::vector<float> c(static_cast<long>(n) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  SetFlops(state, 2.0 * n * n * n);
}
BENCHMARK(BM_SgemmPeak)->Arg(2048)->UseRealTime()->Unit(benchmark::kMillisecond);

// Matmul at the model's four projections: (C, OC) = qkv (768, 2304), attention out (768, 768),
// MLP up (768, 3072), MLP down (3072, 768); N = B*T rows.
void MatmulArgs(benchmark::internal::Benchmark* b) {
  b->Args({kC, 3 * kC})->Args({kC, kC})->Args({kC, 4 * kC})->Args({4 * kC, kC});
  b->ArgNames({"C", "OC"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

void BM_MatmulForward(benchmark::State& state) {
  const int C = static_cast<int>(state.range(0)), OC = static_cast<int>(state.range(1));
  const std::vector<float> inp = Random(static_cast<long>(kN) * C, 3),
                           weight = Random(static_cast<long>(OC) * C, 4), bias = Random(OC, 5);
  std::vector<float> out(static_cast<long>(kN) * OC);
  for (auto _ : state) {
    cpu::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), kN, C, OC);
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, 2.0 * kN * C * OC);
}
BENCHMARK(BM_MatmulForward)->Apply(MatmulArgs);

void BM_MatmulBackward(benchmark::State& state) {
  const int C = static_cast<int>(state.range(0)), OC = static_cast<int>(state.range(1));
  const std::vector<float> inp = Random(static_cast<long>(kN) * C, 6),
                           weight = Random(static_cast<long>(OC) * C, 7),
                           dout = Random(static_cast<long>(kN) * OC, 8);
  std::vector<float> dinp(static_cast<long>(kN) * C), dweight(static_cast<long>(OC) * C), dbias(OC);
  for (auto _ : state) {
    cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                         weight.data(), kN, C, OC);
    benchmark::DoNotOptimize(dweight.data());
  }
  SetFlops(state, 4.0 * kN * C * OC);  // two GEMMs; the bias sum is negligible
}
BENCHMARK(BM_MatmulBackward)->Apply(MatmulArgs);

void BM_AttentionForward(benchmark::State& state) {
  const std::vector<float> qkv = Random(static_cast<long>(kN) * 3 * kC, 9);
  std::vector<float> out(static_cast<long>(kN) * kC), att(static_cast<long>(kB) * kNH * kT * kT);
  for (auto _ : state) {
    cpu::attention_forward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, 4.0 * kB * kT * kT * kC);  // scores and att @ v, each 2 B NH T T HS
}
BENCHMARK(BM_AttentionForward)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_AttentionBackward(benchmark::State& state) {
  const std::vector<float> qkv = Random(static_cast<long>(kN) * 3 * kC, 10),
                           dout = Random(static_cast<long>(kN) * kC, 11);
  std::vector<float> out(static_cast<long>(kN) * kC), att(static_cast<long>(kB) * kNH * kT * kT),
      scratch(att.size()), dqkv(qkv.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  for (auto _ : state) {
    cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), kB,
                            kT, kC, kNH);
    benchmark::DoNotOptimize(dqkv.data());
  }
  SetFlops(state, 8.0 * kB * kT * kT * kC);  // four GEMMs of 2 B NH T T HS
}
BENCHMARK(BM_AttentionBackward)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_LayernormForward(benchmark::State& state) {
  const std::vector<float> inp = Random(static_cast<long>(kN) * kC, 12), w = Random(kC, 13),
                           b = Random(kC, 14);
  std::vector<float> out(inp.size()), mean(kN), rstd(kN);
  for (auto _ : state) {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), kN,
                           kC);
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, 8.0 * kN * kC);
  state.SetBytesProcessed(state.iterations() * 2L * kN * kC * sizeof(float));  // read + write
}
BENCHMARK(BM_LayernormForward)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_LayernormBackward(benchmark::State& state) {
  const std::vector<float> inp = Random(static_cast<long>(kN) * kC, 15), w = Random(kC, 16),
                           b = Random(kC, 17), dout = Random(inp.size(), 18);
  std::vector<float> out(inp.size()), mean(kN), rstd(kN), dinp(inp.size()), dw(kC), db(kC);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), kN,
                         kC);
  for (auto _ : state) {
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            mean.data(), rstd.data(), kN, kC);
    benchmark::DoNotOptimize(dinp.data());
  }
  SetFlops(state, 14.0 * kN * kC);
  // Reads inp and dout twice (dinp pass, then dweight/dbias pass), read-modify-writes dinp.
  state.SetBytesProcessed(state.iterations() * 6L * kN * kC * sizeof(float));
}
BENCHMARK(BM_LayernormBackward)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
