#include "server/nodes/node_registry.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "server/planner/measured_peaks.h"
#include "server/planner_service/cluster_devices.h"

namespace loom::nodes {
namespace {

bool IsNodeIdChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

// The kind a node offers to the scheduler: its GPUs when it has any, else its CPU devices.
v1::DeviceKind NodeKind(const v1::Node& node) {
  for (const v1::Device& d : node.devices()) {
    if (d.kind() == v1::DEVICE_KIND_GPU) return v1::DEVICE_KIND_GPU;
  }
  return v1::DEVICE_KIND_CPU;
}

google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

}  // namespace

absl::Status ValidateRegistration(const v1::RegisterNodeRequest& request,
                                  const DeviceLimits& limits) {
  const std::string& id = request.node_id();
  if (id.empty() || id.size() > 63 || !std::all_of(id.begin(), id.end(), IsNodeIdChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id \"", id.substr(0, 80),
                     "\" is invalid; use 1..63 characters of [a-z0-9-], e.g. \"gpu-node-1\""));
  }
  if (request.devices().empty()) {
    return absl::InvalidArgumentError(
        "devices must list at least one device (a GPU, or a CPU device with --cpu-devices)");
  }
  int gpus = 0;
  for (const v1::Device& d : request.devices()) gpus += d.kind() == v1::DEVICE_KIND_GPU ? 1 : 0;
  const int cpus = request.devices_size() - gpus;
  if (gpus > limits.max_gpus || cpus > limits.max_cpu_devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices lists ", gpus, " GPUs and ", cpus, " CPU devices; a node may register at most ",
        limits.max_gpus, " GPUs and ", limits.max_cpu_devices,
        " CPU devices (loomd's --max-gpus-per-node and --max-cpu-devices-per-node); register "
        "fewer (loom-worker --cpu-devices) or raise the limit"));
  }
  std::set<std::pair<int, int>> seen;
  for (int i = 0; i < request.devices_size(); ++i) {
    const v1::Device& d = request.devices(i);
    if (d.kind() != v1::DEVICE_KIND_GPU && d.kind() != v1::DEVICE_KIND_CPU) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "].kind must be DEVICE_KIND_GPU or DEVICE_KIND_CPU"));
    }
    if (d.index() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "].index must be >= 0 (got ", d.index(), ")"));
    }
    if (!seen.insert({d.kind(), d.index()}).second) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "].index ", d.index(),
                                                     " is listed twice; indices must be unique"));
    }
    // The planner plans every tenant's jobs from these figures: they must be sane.
    if (d.has_peaks()) {
      if (absl::Status st =
              planner::ValidateMeasuredPeaks(planner_service::MeasuredPeaksFromProto(d.peaks()));
          !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("devices[", i, "].", st.message()));
      }
    }
  }
  if (request.cpu_cores() < 0 || request.cpu_cores() > kMaxCpuCores) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_cores must be between 0 (unknown) and ", kMaxCpuCores, " (got ",
                     request.cpu_cores(), "); it counts the cores the worker's ranks run on"));
  }
  if (request.hostname().size() > 255 || request.address().size() > 255 ||
      request.metrics_address().size() > 255) {
    return absl::InvalidArgumentError(
        "hostname, address and metrics_address must be at most 255 characters");
  }
  return absl::OkStatus();
}

const char kOperatorDrainPrefix[] = "operator: ";

bool IsSchedulable(const v1::Node& node) {
  return node.state() == v1::NODE_STATE_READY && !node.draining() &&
         node.unhealthy_reason().empty();
}

std::string NodeName(std::string_view node_id) {
  return absl::StrCat("nodes/", std::string(node_id));
}

void NodeRegistry::Restore(const v1::Node& node, absl::Time now) {
  NodeEntry& entry = nodes_[node.name()];
  entry.node = node;
  entry.node.clear_allocated_devices();
  // A quarantine outlives loomd's restarts: the gangs it keeps alive wait for an operator, and a
  // later loomd (no longer started fresh) would otherwise cancel them as unknown.
  entry.last_seen = now;
}

v1::Node NodeRegistry::Registered(const v1::RegisterNodeRequest& request, absl::Time now) const {
  v1::Node node;
  node.set_name(NodeName(request.node_id()));
  node.set_hostname(request.hostname());
  *node.mutable_devices() = request.devices();
  node.set_state(v1::NODE_STATE_READY);
  *node.mutable_last_heartbeat() = ToProto(now);
  node.set_address(request.address());
  node.set_metrics_address(request.metrics_address());
  node.set_cpu_cores(request.cpu_cores());
  // An operator's drain outlives the worker's restarts; the worker's own drain (it was
  // stopping) and an unhealthy mark (the restarted worker may have been fixed) do not.
  if (const NodeEntry* known = Find(node.name());
      known != nullptr && known->node.draining() &&
      absl::StartsWith(known->node.drain_reason(), kOperatorDrainPrefix)) {
    node.set_draining(true);
    node.set_drain_reason(known->node.drain_reason());
  }
  // So does a quarantine (the session's hello then drops the gangs the worker no longer runs).
  if (const NodeEntry* known = Find(node.name()); known != nullptr) {
    *node.mutable_quarantined() = known->node.quarantined();
  }
  return node;
}

void NodeRegistry::Put(const v1::Node& node, absl::Time now) {
  NodeEntry& entry = nodes_[node.name()];
  entry.node = node;
  entry.node.clear_allocated_devices();
  entry.last_seen = now;
}

NodeEntry* NodeRegistry::Find(std::string_view node_name) {
  auto it = nodes_.find(node_name);
  return it == nodes_.end() ? nullptr : &it->second;
}

const NodeEntry* NodeRegistry::Find(std::string_view node_name) const {
  auto it = nodes_.find(node_name);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<NodeEntry*> NodeRegistry::All() {
  std::vector<NodeEntry*> out;
  for (auto& [name, entry] : nodes_) out.push_back(&entry);
  return out;
}

void NodeRegistry::Remove(std::string_view node_name) {
  auto it = nodes_.find(node_name);
  if (it == nodes_.end()) return;
  if (it->second.session) it->second.session->Close();
  nodes_.erase(it);
}

uint64_t NodeRegistry::OpenSession(std::string_view node_name,
                                   std::shared_ptr<SessionSink> session) {
  NodeEntry* entry = Find(node_name);
  if (entry == nullptr) return 0;
  if (entry->session) entry->session->Close();
  entry->session = std::move(session);
  entry->session_id = next_session_id_++;
  return entry->session_id;
}

void NodeRegistry::CloseSession(std::string_view node_name, uint64_t session_id) {
  NodeEntry* entry = Find(node_name);
  if (entry == nullptr || entry->session_id != session_id || session_id == 0) return;
  if (entry->session) entry->session->Close();
  entry->session.reset();
  entry->session_id = 0;
}

bool NodeRegistry::IsCurrentSession(std::string_view node_name, uint64_t session_id) const {
  const NodeEntry* entry = Find(node_name);
  return entry != nullptr && session_id != 0 && entry->session_id == session_id;
}

bool NodeRegistry::Send(std::string_view node_name, const v1::CoordinatorMessage& message) {
  NodeEntry* entry = Find(node_name);
  if (entry == nullptr || !entry->session) return false;
  return entry->session->Send(message);
}

void NodeRegistry::Allocate(std::string_view node_name, const std::vector<int>& devices,
                            const std::string& job) {
  NodeEntry* entry = Find(node_name);
  if (entry == nullptr) return;
  for (int d : devices) entry->allocated[d] = job;
}

void NodeRegistry::Release(const std::string& job) {
  for (auto& [name, entry] : nodes_) {
    std::erase_if(entry.allocated, [&](const auto& kv) { return kv.second == job; });
  }
}

std::vector<scheduler::NodeSnapshot> NodeRegistry::Snapshot() const {
  std::vector<scheduler::NodeSnapshot> out;
  for (const auto& [name, entry] : nodes_) {
    if (!IsSchedulable(entry.node) || !entry.session) continue;
    scheduler::NodeSnapshot snap;
    snap.name = name;
    snap.ready = true;
    snap.kind = NodeKind(entry.node);
    for (const v1::Device& d : entry.node.devices()) {
      if (d.kind() != snap.kind) continue;
      ++snap.total_devices;
      if (!entry.allocated.contains(d.index())) snap.free_devices.push_back(d.index());
    }
    std::sort(snap.free_devices.begin(), snap.free_devices.end());
    out.push_back(std::move(snap));
  }
  return out;
}

int NodeRegistry::FreeDevices(v1::DeviceKind kind) const {
  int free = 0;
  for (const auto& [name, entry] : nodes_) {
    if (!IsSchedulable(entry.node) || !entry.session || NodeKind(entry.node) != kind) continue;
    for (const v1::Device& d : entry.node.devices()) {
      if (d.kind() == kind && !entry.allocated.contains(d.index())) ++free;
    }
  }
  return free;
}

Capacity NodeRegistry::ReadyCapacity() const {
  Capacity cap;
  for (const auto& [name, entry] : nodes_) {
    if (entry.node.state() != v1::NODE_STATE_READY) continue;
    ++cap.ready_nodes;
    int gpus = 0;
    int cpus = 0;
    for (const v1::Device& d : entry.node.devices()) {
      (d.kind() == v1::DEVICE_KIND_GPU ? gpus : cpus) += 1;
    }
    // A node with GPUs offers only its GPUs to the scheduler (see NodeKind).
    if (gpus > 0) cpus = 0;
    cap.gpus += gpus;
    cap.cpu_devices += cpus;
    cap.max_gpus_per_node = std::max(cap.max_gpus_per_node, gpus);
    cap.max_cpu_devices_per_node = std::max(cap.max_cpu_devices_per_node, cpus);
  }
  return cap;
}

std::vector<v1::Node> NodeRegistry::List() const {
  std::vector<v1::Node> out;
  for (const auto& [name, entry] : nodes_) {
    v1::Node node = entry.node;
    for (const auto& [device, job] : entry.allocated) node.add_allocated_devices(device);
    out.push_back(std::move(node));
  }
  return out;
}

}  // namespace loom::nodes
