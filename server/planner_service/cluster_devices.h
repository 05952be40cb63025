// Where the planner's devices come from, as planner::DeviceSpec: a ClusterDescription sent with
// PlanJob (the cluster file's fields on the wire), or the READY nodes registered with loomd.
// The DeviceSpec describes the whole cluster (count = every device of the kind); PlanJob's
// mapping (plan_mapping.h) narrows it to the devices a job asks for.
//
// Pure functions, no protobuf beyond the messages named; shared by loomd and loomctl.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/planner/device_spec.h"
#include "server/planner/measured_peaks.h"

namespace loom::planner_service {

// INVALID_ARGUMENT naming the field (cluster.nodes, cluster.gpu.model, ...) when a count is not
// positive, a bandwidth or size is negative, or an unknown model lacks memory_gib and
// peak_tflops. Zero optional values keep the model's catalog values.
absl::StatusOr<planner::DeviceSpec> DevicesFromCluster(const v1::ClusterDescription& cluster);

// The catalog name of a device model as workers report it ("NVIDIA H100 80GB HBM3" ->
// "H100-SXM", "NVIDIA A100-SXM4-40GB" -> "A100-40GB", "cpu" -> "cpu"); `memory_bytes` (0 when
// unknown) tells the A100 sizes apart. Empty when the planner does not know the model.
std::string CatalogModelName(absl::string_view reported, double memory_bytes);

// The devices of `kind` on the READY nodes: count over all of them, per_node the most on one
// node, the model from the first device (its reported memory, when smaller than the catalog's,
// replaces it). CPU devices: when every ready node measured its devices (Device.peaks), the
// slowest node's figures replace the catalog's (planner/measured_peaks.h): a gang runs at its
// slowest rank's pace. FAILED_PRECONDITION when there are none, or when the GPU model is unknown to
// the planner (naming it, and how to plan with a cluster description instead).
absl::StatusOr<planner::DeviceSpec> DevicesFromNodes(const std::vector<v1::Node>& nodes,
                                                     v1::DeviceKind kind);

// The measured figures a worker sent with a device (Device.peaks), in the planner's terms.
planner::MeasuredPeaks MeasuredPeaksFromProto(const v1::DevicePeaks& peaks);

// "64 × H100-SXM (80 GiB), 8 per node" ("... measured" when from the nodes' own figures).
std::string DescribeDevices(const planner::DeviceSpec& devices);

}  // namespace loom::planner_service
