#include "server/planner/device_spec.h"

#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::planner {
namespace {

struct CatalogEntry {
  const char* model;
  double memory_gib;
  double peak_tflops;  // dense bf16 (fp32 for cpu)
  double hbm_gb_per_s;
  double nvlink_gb_per_s;   // per device, one direction
  double network_gb_per_s;  // per node, one direction
  EfficiencyTable eff;
};

EfficiencyTable Gpu(double small, double medium, double large) {
  EfficiencyTable t;
  t.gemm_small = small;
  t.gemm_medium = medium;
  t.gemm_large = large;
  return t;
}

EfficiencyTable Cpu() {
  // OpenBLAS sgemm reaches most of the FMA peak on large shapes; Gloo over loopback TCP is
  // slow and latency-bound.
  EfficiencyTable t;
  t.gemm_small = 0.40;
  t.gemm_medium = 0.55;
  t.gemm_large = 0.60;
  t.small_below = 256;
  t.large_from = 1024;
  t.allreduce_intra = 0.5;
  t.allreduce_inter = 0.5;
  t.p2p = 0.5;
  t.latency_intra_s = 30e-6;
  t.latency_inter_s = 60e-6;
  t.memory_bandwidth = 0.6;
  t.block_overhead_s = 20e-6;
  t.fp32_peak_ratio = 1.0;
  return t;
}

// H100's and H200's larger peak is harder to reach than A100's: lower GEMM fractions, which is
// what Megatron's and others' published MFUs show (A100 ~50-55%, H100 ~40-45%).
const std::array<CatalogEntry, 5>& Catalog() {
  static const std::array<CatalogEntry, 5> kCatalog = {{
      {"H100-SXM", 80, 989, 3350, 450, 400, Gpu(0.35, 0.55, 0.65)},
      {"H200", 141, 989, 4800, 450, 400, Gpu(0.36, 0.57, 0.67)},
      {"A100-80GB", 80, 312, 2039, 300, 200, Gpu(0.45, 0.65, 0.75)},
      {"A100-40GB", 40, 312, 1555, 300, 200, Gpu(0.45, 0.65, 0.75)},
      {"cpu", 16, 0.5, 40, 5, 1.25, Cpu()},  // one process on a few cores: calibrate
  }};
  return kCatalog;
}

}  // namespace

double EfficiencyTable::GemmFraction(double smallest_dim) const {
  if (smallest_dim < small_below) return gemm_small;
  if (smallest_dim >= large_from) return gemm_large;
  return gemm_medium;
}

EfficiencyTable ApplyOverrides(EfficiencyTable t, const EfficiencyOverrides& o) {
  if (o.gemm_small) t.gemm_small = *o.gemm_small;
  if (o.gemm_medium) t.gemm_medium = *o.gemm_medium;
  if (o.gemm_large) t.gemm_large = *o.gemm_large;
  if (o.allreduce_intra) t.allreduce_intra = *o.allreduce_intra;
  if (o.allreduce_inter) t.allreduce_inter = *o.allreduce_inter;
  if (o.p2p) t.p2p = *o.p2p;
  if (o.memory_bandwidth) t.memory_bandwidth = *o.memory_bandwidth;
  return t;
}

EfficiencyTable ScaleEfficiency(EfficiencyTable t, double compute_scale, double comm_scale,
                                double optimizer_scale) {
  const auto usable = [](double s) { return std::isfinite(s) && s > 0 ? s : 1.0; };
  const double c = usable(compute_scale), n = usable(comm_scale);
  const double o = std::isfinite(optimizer_scale) && optimizer_scale > 0 ? optimizer_scale : c;
  t.optimizer_bandwidth *= c / o;  // memory_bandwidth carries c below
  t.gemm_small /= c;
  t.gemm_medium /= c;
  t.gemm_large /= c;
  t.memory_bandwidth /= c;
  t.block_overhead_s *= c;
  t.allreduce_intra /= n;
  t.allreduce_inter /= n;
  t.p2p /= n;
  t.latency_intra_s *= n;
  t.latency_inter_s *= n;
  return t;
}

absl::StatusOr<DeviceSpec> DefaultDevice(absl::string_view model, int count, int per_node) {
  for (const CatalogEntry& e : Catalog()) {
    if (model != e.model) continue;
    DeviceSpec d;
    d.model = e.model;
    d.count = count;
    d.per_node = per_node;
    d.memory_bytes = e.memory_gib * kGiB;
    d.peak_flops = e.peak_tflops * 1e12;
    d.memory_bandwidth_bytes_per_s = e.hbm_gb_per_s * 1e9;
    d.intra_node_bytes_per_s = e.nvlink_gb_per_s * 1e9;
    d.inter_node_bytes_per_s = e.network_gb_per_s * 1e9;
    d.efficiency = e.eff;
    return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "gpu.model \"", model, "\" is unknown; one of: ", absl::StrJoin(KnownDeviceModels(), ", "),
      " (or give memory_gib and peak_tflops)"));
}

std::vector<std::string> KnownDeviceModels() {
  std::vector<std::string> names;
  for (const CatalogEntry& e : Catalog()) names.emplace_back(e.model);
  return names;
}

absl::Status ValidateDevices(const DeviceSpec& d) {
  if (d.count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("devices.count must be > 0, got ", d.count));
  }
  if (d.per_node <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices.per_node must be > 0, got ", d.per_node));
  }
  if (d.count > d.per_node && d.count % d.per_node != 0) {
    const int below = d.count / d.per_node * d.per_node;
    return absl::InvalidArgumentError(
        absl::StrCat("devices.count ", d.count, " is not a whole number of nodes of ", d.per_node,
                     ": use ", below, " or ", below + d.per_node));
  }
  struct Field {
    const char* name;
    double value;
  };
  for (const Field& f : {Field{"memory_bytes", d.memory_bytes}, Field{"peak_flops", d.peak_flops},
                         Field{"memory_bandwidth_bytes_per_s", d.memory_bandwidth_bytes_per_s},
                         Field{"intra_node_bytes_per_s", d.intra_node_bytes_per_s},
                         Field{"inter_node_bytes_per_s", d.inter_node_bytes_per_s}}) {
    if (!(f.value > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices.", f.name, " must be > 0, got ", f.value));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::planner
