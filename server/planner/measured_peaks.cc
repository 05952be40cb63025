#include "server/planner/measured_peaks.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/planner/time_model.h"

namespace loom::planner {
namespace {

// Far beyond any single device (an H200 is about 1e15 dense bf16 FLOP/s, 5e12 bytes/s of HBM):
// a figure above these is a broken or hostile measurement, not a fast device.
constexpr double kMaxFlops = 1e17;
constexpr double kMaxBytesPerSecond = 1e14;
constexpr int kMaxDim = 1 << 16;
constexpr size_t kMaxSamples = 16;

bool Positive(double x, double max) { return std::isfinite(x) && x > 0 && x <= max; }
bool Dim(int x) { return x >= 1 && x <= kMaxDim; }

enum GemmClass { kSmall = 0, kMedium = 1, kLarge = 2 };

GemmClass ClassOf(const EfficiencyTable& e, double smallest) {
  if (smallest < e.small_below) return kSmall;
  if (smallest >= e.large_from) return kLarge;
  return kMedium;
}

// Seconds of one block forward + backward under `d` (BlockCost's forward + backward).
double BlockSeconds(const DeviceSpec& d, const MeasuredBlock& b) {
  ModelShape m;
  m.name = "measured";
  m.layers = 1;
  m.hidden = b.hidden;
  m.heads = b.heads;
  m.seq_len = b.seq_len;
  m.vocab = 64;
  Layout l;
  l.micro_batch = b.micro_batch;
  const BlockTime t = BlockCost(m, Precision::kFp32, l, d);
  return t.forward + t.backward;
}

}  // namespace

absl::Status ValidateMeasuredPeaks(const MeasuredPeaks& m) {
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", why,
                     "; the worker's device measurement is broken: restart it "
                     "with --measure-devices=false, or fix its loom-train"));
  };
  if (m.gemm.size() > kMaxSamples) return bad("peaks.gemm", "has more than 16 samples");
  if (m.blocks.size() > kMaxSamples) return bad("peaks.blocks", "has more than 16 samples");
  for (size_t i = 0; i < m.gemm.size(); ++i) {
    const MeasuredGemm& g = m.gemm[i];
    const std::string f = absl::StrCat("peaks.gemm[", i, "]");
    if (!Dim(g.rows) || !Dim(g.inner) || !Dim(g.cols)) {
      return bad(f, "has a shape outside [1, 65536]");
    }
    if (!Positive(g.flops_per_s, kMaxFlops)) {
      return bad(f + ".flops_per_second", absl::StrCat("is ", g.flops_per_s, ", not in (0, 1e17]"));
    }
  }
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const MeasuredBlock& b = m.blocks[i];
    const std::string f = absl::StrCat("peaks.blocks[", i, "]");
    if (!Dim(b.hidden) || !Dim(b.seq_len) || !Dim(b.micro_batch) || b.heads < 1 ||
        b.heads > b.hidden) {
      return bad(f, "has a shape outside [1, 65536] (or heads outside [1, hidden])");
    }
    if (!Positive(b.seconds, 3600)) {
      return bad(f + ".seconds", absl::StrCat("is ", b.seconds, ", not in (0, 3600]"));
    }
  }
  if (m.optimizer_bytes_per_s != 0 && !Positive(m.optimizer_bytes_per_s, kMaxBytesPerSecond)) {
    return bad("peaks.optimizer_bytes_per_second",
               absl::StrCat("is ", m.optimizer_bytes_per_s, ", not in (0, 1e14]"));
  }
  return absl::OkStatus();
}

DeviceSpec ApplyMeasuredPeaks(DeviceSpec d, const MeasuredPeaks& m) {
  if (m.gemm.empty()) return d;
  EfficiencyTable& e = d.efficiency;

  // GEMM classes: the mean rate of the samples in each class, then the nearest for the others.
  std::array<double, 3> sum{}, count{};
  for (const MeasuredGemm& g : m.gemm) {
    const GemmClass c = ClassOf(e, std::min({g.rows, g.inner, g.cols}));
    sum[c] += g.flops_per_s;
    count[c] += 1;
  }
  std::array<double, 3> rate{};
  for (int c = 0; c < 3; ++c) {
    if (count[c] > 0) {
      rate[c] = sum[c] / count[c];
      continue;
    }
    // The nearest measured class; at equal distance the slower one (the prediction errs long).
    double best = 0;
    for (int dist = 1; dist < 3 && best == 0; ++dist) {
      for (int n : {c - dist, c + dist}) {
        if (n < 0 || n > 2 || count[n] == 0) continue;
        const double r = sum[n] / count[n];
        best = best == 0 ? r : std::min(best, r);
      }
    }
    rate[c] = best;
  }
  const double peak = *std::max_element(rate.begin(), rate.end());
  d.peak_flops = peak / (e.fp32_peak_ratio > 0 ? e.fp32_peak_ratio : 1.0);
  e.gemm_small = rate[kSmall] / peak;
  e.gemm_medium = rate[kMedium] / peak;
  e.gemm_large = rate[kLarge] / peak;

  // Blocks: y_i = measured - GEMMs = bytes_i / bandwidth + overhead, fitted by least squares.
  if (!m.blocks.empty()) {
    DeviceSpec gemm_only = d;
    gemm_only.memory_bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
    gemm_only.efficiency.block_overhead_s = 0;
    DeviceSpec bytes_only = d;
    bytes_only.peak_flops = std::numeric_limits<double>::infinity();
    bytes_only.memory_bandwidth_bytes_per_s = 1;
    bytes_only.efficiency.memory_bandwidth = 1;
    bytes_only.efficiency.block_overhead_s = 0;
    std::vector<double> x, y;
    for (const MeasuredBlock& b : m.blocks) {
      x.push_back(BlockSeconds(bytes_only, b));  // bytes moved by the element-wise kernels
      y.push_back(b.seconds - BlockSeconds(gemm_only, b));
    }
    const double n = static_cast<double>(x.size());
    double mx = 0, my = 0;
    for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i)
      sxx += (x[i] - mx) * (x[i] - mx), sxy += (x[i] - mx) * (y[i] - my);
    double inverse_bw = 0, overhead = 0;
    if (sxx > 0) {
      inverse_bw = sxy / sxx;
      overhead = my - inverse_bw * mx;
    }
    if (!(inverse_bw > 0) || !(overhead >= 0) || !std::isfinite(inverse_bw + overhead)) {
      overhead = 0;
      inverse_bw = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (x[i] > 0 && y[i] > 0) inverse_bw = std::max(inverse_bw, y[i] / x[i]);
      }
    }
    if (inverse_bw > 0 && std::isfinite(inverse_bw)) {
      d.memory_bandwidth_bytes_per_s = 1.0 / inverse_bw;
      e.memory_bandwidth = 1.0;
      e.block_overhead_s = overhead;
    }
  }
  if (m.optimizer_bytes_per_s > 0) {
    e.optimizer_bandwidth =
        m.optimizer_bytes_per_s / (d.memory_bandwidth_bytes_per_s * e.memory_bandwidth);
  }
  d.measured = true;
  d.shares_node_compute = d.model == "cpu";
  return d;
}

std::string CalibrationKey(const DeviceSpec& d) {
  return d.measured ? absl::StrCat(d.model, "@measured") : d.model;
}

}  // namespace loom::planner
