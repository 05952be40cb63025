// NodeRegistry: loomd's in-memory view of the worker nodes: inventory, state, liveness, the
// open session of each node, and which devices are allocated to which job.
//
// A node is READY from its registration (or from loomd's start, for nodes known to the store)
// until no message arrives for the node timeout; then it is LOST until it says hello again.
// Devices are schedulable only on READY nodes with an open session.
//
// Threading: NOT thread-safe; the job manager owns the registry and guards it with its lock,
// because node changes and job changes must be decided together.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "server/nodes/session_sink.h"
#include "server/scheduler/gang_scheduler.h"

namespace loom::nodes {

struct NodeEntry {
  v1::Node node;                         // name, inventory, state and last_heartbeat as stored
  absl::Time last_seen;                  // last message from the worker (or loomd's start)
  std::shared_ptr<SessionSink> session;  // null when no session is open
  uint64_t session_id = 0;               // identifies `session`; 0 when none
  std::map<int, std::string> allocated;  // device index -> job name
};

// Devices of READY nodes, for spec validation ("more devices than the cluster has").
struct Capacity {
  int gpus = 0;
  int cpu_devices = 0;
  int max_gpus_per_node = 0;
  int max_cpu_devices_per_node = 0;
  int ready_nodes = 0;
};

// The most devices one node may register (loomd's --max-gpus-per-node and
// --max-cpu-devices-per-node): every device costs loomd memory and store space for as long as
// the node is known, so an inventory far beyond any real machine is refused.
struct DeviceLimits {
  int max_gpus = 64;
  int max_cpu_devices = 1024;
};

// The most cores a node may report (RegisterNodeRequest.cpu_cores): far beyond any machine.
inline constexpr int kMaxCpuCores = 65536;

// Checks a RegisterNodeRequest: node_id [a-z0-9-]{1,63}, at least one device, at most `limits`
// devices of each kind, device kinds set and indices unique and >= 0, cpu_cores in
// 0..kMaxCpuCores. INVALID_ARGUMENT naming the field and the fix.
absl::Status ValidateRegistration(const v1::RegisterNodeRequest& request,
                                  const DeviceLimits& limits = {});

// Node.drain_reason of a drain asked for by an operator (DrainNode).
extern const char kOperatorDrainPrefix[];

// Whether the scheduler may place new work on the node: READY, not draining, healthy.
bool IsSchedulable(const v1::Node& node);

// "nodes/{id}" for a node id.
std::string NodeName(std::string_view node_id);

class NodeRegistry {
 public:
  // Adds a node known from the store at start-up: its state is kept, last_seen = `now`, no
  // session. It becomes LOST if it does not say hello within the node timeout.
  void Restore(const v1::Node& node, absl::Time now);

  // The node as it would be after registering `request` at `now` (READY, inventory replaced),
  // without changing the registry: the caller persists it first, then calls Put().
  v1::Node Registered(const v1::RegisterNodeRequest& request, absl::Time now) const;

  // Inserts or replaces the node record (keeping session and allocations), last_seen = `now`.
  void Put(const v1::Node& node, absl::Time now);

  NodeEntry* Find(std::string_view node_name);
  const NodeEntry* Find(std::string_view node_name) const;
  std::vector<NodeEntry*> All();
  // Forgets the node (its session is closed). Allocations must have been released.
  void Remove(std::string_view node_name);

  // Installs `session` as the node's session and returns its id; the previous session, if any,
  // is closed. The node must exist.
  uint64_t OpenSession(std::string_view node_name, std::shared_ptr<SessionSink> session);
  // Clears the node's session if it is still `session_id` (a replaced session ends quietly).
  void CloseSession(std::string_view node_name, uint64_t session_id);
  bool IsCurrentSession(std::string_view node_name, uint64_t session_id) const;

  // Sends to the node's session; false when the node has none (the message is dropped).
  bool Send(std::string_view node_name, const v1::CoordinatorMessage& message);

  // Marks devices of `node_name` as used by `job` / frees every device `job` holds anywhere.
  void Allocate(std::string_view node_name, const std::vector<int>& devices,
                const std::string& job);
  void Release(const std::string& job);

  // Schedulable nodes (IsSchedulable, with a session) and their free devices, for
  // scheduler::Schedule.
  std::vector<scheduler::NodeSnapshot> Snapshot() const;
  // The free devices of `kind` over the nodes Snapshot() gives, counted without building it (a
  // CreateJob asks on every call; a snapshot copies every node's name and free list).
  int FreeDevices(v1::DeviceKind kind) const;
  Capacity ReadyCapacity() const;

  // The node protos with allocated_devices filled, sorted by name.
  std::vector<v1::Node> List() const;

 private:
  std::map<std::string, NodeEntry, std::less<>> nodes_;  // by nodes/{id}
  uint64_t next_session_id_ = 1;
};

}  // namespace loom::nodes
