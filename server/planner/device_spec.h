// The devices a plan is made for, and the efficiency table that turns their peak numbers into
// achievable ones. Defaults per device model live here; calibration (measured step times of
// finished jobs, server/calibration) scales them through ScaleEfficiency.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::planner {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;

// Achieved fractions of peak. GEMMs are classed by their smallest dimension per rank (the
// tokens of a micro-batch b·s, or the per-rank width h/t): narrow GEMMs cannot fill the
// device's tiles and waves, so they run further from peak.
struct EfficiencyTable {
  double gemm_small = 0.45;   // smallest GEMM dimension < small_below
  double gemm_medium = 0.65;  // in between
  double gemm_large = 0.75;   // smallest GEMM dimension >= large_from
  int small_below = 1024;
  int large_from = 4096;
  // All-reduce bus bandwidth as a fraction of the link bandwidth (NCCL's busBW / link),
  // inside a node and across nodes.
  double allreduce_intra = 0.80;
  double allreduce_inter = 0.75;
  // Point-to-point (pipeline send/recv) fraction of the link bandwidth.
  double p2p = 0.80;
  // Latency per step of a ring collective, and per point-to-point message, in seconds.
  double latency_intra_s = 2e-6;
  double latency_inter_s = 6e-6;
  // Fraction of memory bandwidth reached by the memory-bound kernels (optimizer, embedding,
  // softmax/cross-entropy).
  double memory_bandwidth = 0.80;
  // The optimizer's own factor on top of memory_bandwidth (1 in every catalog entry; calibration
  // sets it when the measured optimizer phase says AdamW runs apart from the other kernels).
  double optimizer_bandwidth = 1.0;
  // Fixed cost per block per micro-batch, forward and backward together: the launch and tail
  // of its ~24 kernels (about 2.5 µs each on a GPU without CUDA graphs). It is what makes
  // tiny micro-batches slow.
  double block_overhead_s = 60e-6;
  // fp32 training runs its GEMMs at this fraction of the (bf16) peak: TF32 tensor cores give
  // half the bf16 rate on A100/H100; on CPUs the peak is already the fp32 peak.
  double fp32_peak_ratio = 0.5;

  double GemmFraction(double smallest_dim) const;
};

// Calibrated corrections; unset entries keep the defaults.
struct EfficiencyOverrides {
  std::optional<double> gemm_small, gemm_medium, gemm_large;
  std::optional<double> allreduce_intra, allreduce_inter, p2p, memory_bandwidth;
};
EfficiencyTable ApplyOverrides(EfficiencyTable table, const EfficiencyOverrides& o);

// The table corrected by calibration (server/calibration): every predicted compute time (GEMMs,
// memory-bound kernels, the per-block overhead, hence forward, backward and bubble) multiplied
// by `compute_scale`, the optimizer's by `optimizer_scale` (0: as compute), every communication
// time (bus and point-to-point bandwidth fractions, latencies) by `comm_scale`. The GEMM and
// bandwidth fractions are divided by the scales, so a calibrated fraction may exceed 1 when the
// catalog's peak understates the device. Other scales that are not finite and > 0 are treated
// as 1. Pure.
EfficiencyTable ScaleEfficiency(EfficiencyTable table, double compute_scale, double comm_scale,
                                double optimizer_scale = 0);

struct DeviceSpec {
  std::string model;                        // "H100-SXM", "H200", "A100-80GB", "A100-40GB", "cpu"
  int count = 0;                            // devices available to the job
  int per_node = 1;                         // devices per node (the NVLink domain)
  double memory_bytes = 0;                  // per device
  double peak_flops = 0;                    // dense bf16 per device (fp32 peak on CPUs)
  double memory_bandwidth_bytes_per_s = 0;  // HBM (or DRAM share) per device
  double intra_node_bytes_per_s = 0;        // per device, one direction (NVLink)
  double inter_node_bytes_per_s = 0;        // per node, one direction (all NICs together)
  EfficiencyTable efficiency;
  // Set when the compute figures come from the node's own measurement (measured_peaks.h)
  // rather than the catalog.
  bool measured = false;
  // CPU devices of one node run on the same cores: k ranks of a job on one node each compute at
  // 1/k of the measured (alone) rate. Set with measured CPU figures.
  bool shares_node_compute = false;
};

// The catalog: a DeviceSpec for `count` devices of a known model, `per_node` to a node, with
// published peak numbers (dense bf16 FLOP/s, HBM size and bandwidth, NVLink per direction) and
// a 400 GB/s-per-node network (8 × 400 Gb/s), which callers override from the cluster file.
// "cpu" describes one CPU training process of the CPU backend (Gloo over TCP).
absl::StatusOr<DeviceSpec> DefaultDevice(absl::string_view model, int count, int per_node);
std::vector<std::string> KnownDeviceModels();

// INVALID_ARGUMENT naming the field when a count, size or bandwidth is not positive, or when
// the count is not a whole number of nodes while spanning more than one.
absl::Status ValidateDevices(const DeviceSpec& d);

}  // namespace loom::planner
