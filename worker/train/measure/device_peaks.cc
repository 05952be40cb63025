#include "worker/train/measure/device_peaks.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/adamw.h"
#include "kernels/matmul.h"
#include "worker/train/model/gpt.h"
#include "worker/train/rng.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

// Timed samples after warm-ups; the median is reported (a shared machine's hiccups land in
// the tails). A sample repeats the operation until it lasts about kSampleSeconds: a single
// sub-millisecond GEMM is at the mercy of one thread wake-up (3 single calls of the 64-wide
// GEMM measured 2, 5 and 77 GFLOP/s on one machine).
constexpr int kRepetitions = 5;
constexpr double kSampleSeconds = 0.02;

double MedianSeconds(const std::function<void()>& run) {
  auto time = [&](int times) {
    const auto t0 = Clock::now();
    for (int i = 0; i < times; ++i) run();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  time(1);  // warm-up: first touch of the buffers, OpenMP and OpenBLAS thread start
  const double once = std::max(time(1), 1e-7);
  const int times = std::clamp(static_cast<int>(kSampleSeconds / once), 1, 10000);
  std::vector<double> s;
  for (int i = 0; i < kRepetitions; ++i) s.push_back(time(times) / times);
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.NextUniform() * 2.0 - 1.0);
  return v;
}

// matmul forward + backward at (rows, inner) @ (inner, cols)^T, the training core's own GEMMs.
GemmSample MeasureGemm(int rows, int inner, int cols) {
  const size_t n_in = size_t(rows) * inner, n_w = size_t(inner) * cols, n_out = size_t(rows) * cols;
  std::vector<float> inp = Random(n_in, 1), weight = Random(n_w, 2), bias = Random(cols, 3);
  std::vector<float> out(n_out), dout = Random(n_out, 4), dinp(n_in), dweight(n_w), dbias(cols);
  const double seconds = MedianSeconds([&] {
    kernels::cpu::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), rows, inner,
                                 cols);
    kernels::cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(),
                                  inp.data(), weight.data(), rows, inner, cols);
  });
  GemmSample g;
  g.rows = rows, g.inner = inner, g.cols = cols;
  g.flops_per_second = 6.0 * rows * inner * cols / std::max(seconds, 1e-9);
  return g;
}

// One block of a one-layer GPT, forward + backward of one micro-batch, timed by the model's own
// per-block costs (profiler/block_costs.h) so that the embedding and head are left out.
BlockSample MeasureBlock(int hidden, int heads, int seq_len, int micro_batch) {
  ModelDims dims;
  dims.layers = 1;
  dims.channels = hidden;
  dims.heads = heads;
  dims.max_seq_len = seq_len;
  dims.vocab = 64;  // the head is not timed; keep it cheap
  GPT model(dims);
  model.InitWeights(7);
  Rng rng(11);
  std::vector<int> tokens(size_t(micro_batch) * seq_len), targets(tokens.size());
  for (int& t : tokens) t = static_cast<int>(rng.NextBelow(dims.vocab));
  for (int& t : targets) t = static_cast<int>(rng.NextBelow(dims.vocab));
  BlockCosts costs;
  model.set_block_costs(&costs);
  auto one = [&] {
    costs.Reset(0, 1);
    model.ZeroGrad();
    model.Forward(tokens.data(), targets.data(), micro_batch, seq_len);
    model.Backward(1.0f);
    return costs.forward[0] + costs.backward[0];
  };
  one();  // warm-up
  const int times = std::clamp(static_cast<int>(kSampleSeconds / std::max(one(), 1e-7)), 1, 1000);
  std::vector<double> s;
  for (int i = 0; i < kRepetitions; ++i) {
    double sum = 0;
    for (int k = 0; k < times; ++k) sum += one();
    s.push_back(sum / times);
  }
  std::sort(s.begin(), s.end());
  model.set_block_costs(nullptr);
  BlockSample b;
  b.hidden = hidden, b.heads = heads, b.seq_len = seq_len, b.micro_batch = micro_batch;
  b.seconds = s[s.size() / 2];
  return b;
}

double MeasureOptimizer() {
  constexpr long kParams = 4L << 20;  // 4 Mi parameters: 112 MiB moved, far beyond the caches
  std::vector<float> p = Random(kParams, 5), g = Random(kParams, 6), m(kParams), v(kParams);
  int t = 0;
  const double seconds = MedianSeconds([&] {
    kernels::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), kParams, 1e-4f, 0.9f, 0.95f,
                               1e-8f, 0.1f, ++t);
  });
  return 28.0 * kParams / std::max(seconds, 1e-9);
}

}  // namespace

CpuPeaks MeasureCpuPeaks() {
  const auto start = Clock::now();
  CpuPeaks p;
#ifdef _OPENMP
  p.threads = omp_get_max_threads();
#endif
  // One shape per GEMM class of the planner's CPU table (small < 256 <= medium < 1024 <= large):
  // 1024 token rows, a square weight of the class's width.
  for (int width : {64, 256, 1024}) p.gemm.push_back(MeasureGemm(1024, width, width));
  // Two block shapes far apart in width, so that the planner can separate the cost that grows
  // with the element-wise traffic from the fixed cost per block.
  p.blocks.push_back(MeasureBlock(64, 4, 64, 16));
  p.blocks.push_back(MeasureBlock(256, 4, 128, 4));
  p.optimizer_bytes_per_second = MeasureOptimizer();
  p.measure_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return p;
}

std::string CpuPeaksJson(const CpuPeaks& p) {
  std::string out = "{\"event\":\"device_peaks\",\"device\":\"cpu\",\"gemm\":[";
  char buf[256];
  for (size_t i = 0; i < p.gemm.size(); ++i) {
    const GemmSample& g = p.gemm[i];
    std::snprintf(buf, sizeof buf,
                  "%s{\"rows\":%d,\"inner\":%d,\"cols\":%d,\"flops_per_second\":%.6g}",
                  i ? "," : "", g.rows, g.inner, g.cols, g.flops_per_second);
    out += buf;
  }
  out += "],\"blocks\":[";
  for (size_t i = 0; i < p.blocks.size(); ++i) {
    const BlockSample& b = p.blocks[i];
    std::snprintf(buf, sizeof buf,
                  "%s{\"hidden\":%d,\"heads\":%d,\"seq_len\":%d,\"micro_batch\":%d,"
                  "\"seconds\":%.6g}",
                  i ? "," : "", b.hidden, b.heads, b.seq_len, b.micro_batch, b.seconds);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "],\"optimizer_bytes_per_second\":%.6g,\"threads\":%d,\"measure_seconds\":%.4g}",
                p.optimizer_bytes_per_second, p.threads, p.measure_seconds);
  out += buf;
  return out;
}

}  // namespace loom::train
