#include "server/planner_service/cluster_devices.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/planner/plan_explanation.h"

namespace loom::planner_service {
namespace {

absl::Status Invalid(absl::string_view field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// A value that must be finite and >= 0 (0: use the catalog's value).
absl::Status CheckOptional(absl::string_view field, double value) {
  if (!std::isfinite(value) || value < 0) {
    return Invalid(field, absl::StrCat(value, " must be a finite number > 0, or 0 for the "
                                              "model's default"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<planner::DeviceSpec> DevicesFromCluster(const v1::ClusterDescription& cluster) {
  if (cluster.nodes() <= 0) {
    return Invalid("cluster.nodes", absl::StrCat(cluster.nodes(), " must be > 0"));
  }
  if (cluster.gpus_per_node() <= 0) {
    return Invalid("cluster.gpus_per_node",
                   absl::StrCat(cluster.gpus_per_node(), " must be > 0"));
  }
  // Keeps nodes × gpus_per_node in int range (the cluster file has the same bound).
  if (int64_t{cluster.nodes()} * cluster.gpus_per_node() > (1 << 24)) {
    return Invalid("cluster.nodes", "nodes × gpus_per_node is implausibly large (> 16M)");
  }
  const v1::ClusterGpu& gpu = cluster.gpu();
  if (gpu.model().empty()) {
    return Invalid("cluster.gpu.model",
                   absl::StrCat("missing; one of ",
                                absl::StrJoin(planner::KnownDeviceModels(), ", "),
                                ", or any name with memory_gib and peak_tflops"));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"cluster.gpu.memory_gib", gpu.memory_gib()},
        {"cluster.gpu.peak_tflops", gpu.peak_tflops()},
        {"cluster.intra_node_gb_per_s", cluster.intra_node_gb_per_s()},
        {"cluster.inter_node_gb_per_s", cluster.inter_node_gb_per_s()}}) {
    absl::Status s = CheckOptional(field, value);
    if (!s.ok()) return s;
  }
  const int count = cluster.nodes() * cluster.gpus_per_node();
  planner::DeviceSpec d;
  absl::StatusOr<planner::DeviceSpec> known =
      planner::DefaultDevice(gpu.model(), count, cluster.gpus_per_node());
  if (known.ok()) {
    d = *std::move(known);
  } else {
    if (gpu.memory_gib() <= 0 || gpu.peak_tflops() <= 0) {
      return Invalid("cluster.gpu",
                     absl::StrCat("model \"", gpu.model(), "\" is not in the catalog (",
                                  absl::StrJoin(planner::KnownDeviceModels(), ", "),
                                  "); give memory_gib and peak_tflops for it"));
    }
    // An unknown model: H100-like bandwidths and efficiencies unless given.
    d = *planner::DefaultDevice("H100-SXM", count, cluster.gpus_per_node());
    d.model = gpu.model();
  }
  if (gpu.memory_gib() > 0) d.memory_bytes = gpu.memory_gib() * planner::kGiB;
  if (gpu.peak_tflops() > 0) d.peak_flops = gpu.peak_tflops() * 1e12;
  if (cluster.intra_node_gb_per_s() > 0) {
    d.intra_node_bytes_per_s = cluster.intra_node_gb_per_s() * 1e9;
  }
  if (cluster.inter_node_gb_per_s() > 0) {
    d.inter_node_bytes_per_s = cluster.inter_node_gb_per_s() * 1e9;
  }
  return d;
}

std::string CatalogModelName(absl::string_view reported, double memory_bytes) {
  const std::string name = absl::AsciiStrToUpper(reported);
  if (name == "CPU") return "cpu";
  if (absl::StrContains(name, "H200")) return "H200";
  if (absl::StrContains(name, "H100")) return "H100-SXM";
  if (absl::StrContains(name, "A100")) {
    if (memory_bytes > 0) return memory_bytes > 60 * planner::kGiB ? "A100-80GB" : "A100-40GB";
    return absl::StrContains(name, "80GB") ? "A100-80GB" : "A100-40GB";
  }
  // Exact catalog names pass through ("H100-SXM", "A100-80GB").
  for (const std::string& known : planner::KnownDeviceModels()) {
    if (absl::AsciiStrToUpper(known) == name) return known;
  }
  return "";
}

absl::StatusOr<planner::DeviceSpec> DevicesFromNodes(const std::vector<v1::Node>& nodes,
                                                     v1::DeviceKind kind) {
  const bool gpu = kind == v1::DEVICE_KIND_GPU;
  const char* what = gpu ? "GPUs" : "CPU devices";
  int total = 0, per_node = 0;
  const v1::Device* first = nullptr;
  double least_memory = 0;
  for (const v1::Node& node : nodes) {
    if (node.state() != v1::NODE_STATE_READY) continue;
    int here = 0;
    for (const v1::Device& device : node.devices()) {
      if (device.kind() != kind) continue;
      ++here;
      if (first == nullptr) first = &device;
      const double memory = static_cast<double>(device.memory_bytes());
      if (memory > 0 && (least_memory == 0 || memory < least_memory)) least_memory = memory;
    }
    total += here;
    per_node = std::max(per_node, here);
  }
  if (total == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the live cluster has no ", what, " on a ready node; register nodes with ", what,
        ", or plan against a cluster description (loomctl plan --cluster FILE)"));
  }
  if (!gpu) {
    absl::StatusOr<planner::DeviceSpec> d = planner::DefaultDevice("cpu", total, per_node);
    if (!d.ok()) return d.status();
    // The slowest node's measurement (the most block seconds, else the slowest GEMMs); none
    // unless every ready node with CPU devices measured them.
    const v1::DevicePeaks* slowest = nullptr;
    double slowest_cost = -1;
    bool all_measured = true;
    for (const v1::Node& node : nodes) {
      if (node.state() != v1::NODE_STATE_READY) continue;
      for (const v1::Device& device : node.devices()) {
        if (device.kind() != kind) continue;
        if (!device.has_peaks() || device.peaks().gemm().empty()) {
          all_measured = false;
          continue;
        }
        double cost = 0;
        for (const v1::BlockTiming& b : device.peaks().blocks()) cost += b.seconds();
        if (cost == 0) {
          for (const v1::GemmThroughput& g : device.peaks().gemm()) {
            cost = std::max(cost, 1.0 / std::max(g.flops_per_second(), 1.0));
          }
        }
        if (cost > slowest_cost) slowest_cost = cost, slowest = &device.peaks();
      }
    }
    if (!all_measured || slowest == nullptr) return d;
    return planner::ApplyMeasuredPeaks(*std::move(d), MeasuredPeaksFromProto(*slowest));
  }
  const std::string model = CatalogModelName(first->model(), least_memory);
  if (model.empty() || model == "cpu") {
    return absl::FailedPreconditionError(absl::StrCat(
        "the live cluster's GPU model \"", first->model(), "\" is unknown to the planner (it "
        "knows ", absl::StrJoin(planner::KnownDeviceModels(), ", "),
        "); plan against a cluster description with its memory_gib and peak_tflops "
        "(loomctl plan --cluster FILE)"));
  }
  absl::StatusOr<planner::DeviceSpec> d = planner::DefaultDevice(model, total, per_node);
  if (!d.ok()) return d.status();
  // The driver's figure is what the allocator can get; the catalog's is the nominal size.
  if (least_memory > 0 && least_memory < d->memory_bytes) d->memory_bytes = least_memory;
  return d;
}

planner::MeasuredPeaks MeasuredPeaksFromProto(const v1::DevicePeaks& peaks) {
  planner::MeasuredPeaks m;
  for (const v1::GemmThroughput& g : peaks.gemm()) {
    m.gemm.push_back({g.rows(), g.inner(), g.cols(), g.flops_per_second()});
  }
  for (const v1::BlockTiming& b : peaks.blocks()) {
    m.blocks.push_back({b.hidden(), b.heads(), b.seq_len(), b.micro_batch(), b.seconds()});
  }
  m.optimizer_bytes_per_s = peaks.optimizer_bytes_per_second();
  return m;
}

std::string DescribeDevices(const planner::DeviceSpec& devices) {
  return absl::StrCat(devices.count, " × ", devices.model, " (",
                      planner::FormatGiB(devices.memory_bytes), "), ", devices.per_node,
                      " per node", devices.measured ? ", figures measured on the nodes" : "");
}

}  // namespace loom::planner_service
