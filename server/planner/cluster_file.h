// The cluster file for planning ahead without a cluster (DESIGN.md, "The planner and the
// doctor"):
//
//   nodes: 64
//   gpus_per_node: 8
//   gpu: {model: H100-SXM, memory_gib: 80, peak_tflops: 989}
//   intra_node_gb_per_s: 450     # per GPU, one direction (NVLink)
//   inter_node_gb_per_s: 400     # per node, one direction (network)
//
// Optional: gpu.memory_bandwidth_gb_per_s, and `efficiency: {gemm_small, gemm_medium,
// gemm_large, allreduce_intra, allreduce_inter, p2p, memory_bandwidth}` overriding the
// defaults of the GPU model. For a model the catalog knows (device_spec.h) every gpu field but
// `model` and both bandwidths are optional; for other models all are required.
//
// Kept apart from the planner's core so that only this file depends on yaml-cpp; yaml-cpp's
// exceptions are caught here and become INVALID_ARGUMENT with "name:line:column: key: problem".
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/planner/device_spec.h"

namespace loom::planner {

// `source` names the text in error messages (the file name as the user gave it).
absl::StatusOr<DeviceSpec> ParseClusterYaml(absl::string_view text,
                                            absl::string_view source = "cluster.yaml");

// Reads and parses a file; NOT_FOUND when it cannot be read.
absl::StatusOr<DeviceSpec> LoadClusterFile(const std::string& path);

}  // namespace loom::planner
