// The gang scheduler: a pure function from a cluster snapshot and the queue to placements.
// No RPC, no clock, no logging: the job manager takes a snapshot under its lock, calls
// Schedule(), and applies the decision. Guarantees (tested from tables and random snapshots):
//  - all or nothing: a job gets every device it asks for at once, or none;
//  - no device is ever given twice (nor one that the snapshot shows as busy);
//  - order: priority descending, then sequence ascending (FIFO);
//  - packing: a job's ranks sit on as few nodes as possible;
//  - tensor groups: ranks r .. r+tp-1 (tp fastest in rank order) share a node whenever tp fits
//    in a node.
//
// Policy, in the order it is applied to each job of the sorted queue:
//  1. Eligible nodes: ready, and of the job's device kind. Only the snapshot's free devices are
//     used; duplicates and negative indices in a free list are ignored.
//  2. Tensor groups: when tp is at most the device count of the largest eligible node, devices
//     are handed out in whole groups of tp on one node (ranks [k*tp, (k+1)*tp) share a node);
//     otherwise no node can hold a group and the job is placed device by device.
//  3. Packing: if one node can take the whole job, it goes to the best fit — the node with the
//     fewest free devices that still fits, ties by name — which keeps whole nodes free for
//     large gangs. Otherwise the job spreads over as few nodes as possible: the nodes with the
//     most free groups are filled first and the last node is the best fit for the remainder.
//     Ranks are numbered node by node, lowest free device index first.
//  4. Head of line, no backfill: a job that cannot be placed now blocks every job behind it
//     (lower or equal priority) that competes for the same device kind, even a small one that
//     would fit. Why: with backfill, a stream of small jobs keeps taking the devices that a
//     large gang is waiting for, and the large gang starves; blocking guarantees it runs as
//     soon as enough running jobs finish. Two exceptions keep the queue from wedging, since
//     waiting cannot help these jobs: a job that would not fit even if every eligible node
//     were idle, and an invalid request (devices < 1, tp < 1, tp not dividing devices, no
//     device kind). They wait with their reason and block nobody.
//  5. Avoided nodes: a job's avoid_nodes are hidden from it alone (other jobs may use them); a
//     job that waits only because of them does not block the jobs behind it.
//  Every job that is not placed gets a human-readable reason, e.g.
//    "needs 8 CPU devices in tensor groups of 2; 3 free on 2 ready nodes"
//    "behind jobs/abc (priority 0) which waits for devices"
//
// Complexity: O(Q log Q) for sorting plus, per job, O(D + k log N) where D is the largest
// free-device count of a node and k the nodes the job lands on (nodes are kept in buckets by
// free count), so 10,000 jobs over 1,000 nodes decide in milliseconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/v1/node.pb.h"

namespace loom::scheduler {

struct NodeSnapshot {
  std::string name;   // nodes/{node}; unique (a repeated name is ignored after its first entry)
  bool ready = true;  // LOST nodes get nothing
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  std::vector<int> free_devices;  // device indices free now, ascending
  int total_devices = 0;          // free + busy; decides whether a job could ever fit
};

struct JobRequest {
  std::string job;  // jobs/{job}
  int priority = 0;
  int64_t sequence = 0;  // store order, FIFO within a priority
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  int devices = 1;
  int tensor = 1;  // tensor-parallel size; divides `devices`
  // Nodes this job must not be placed on now (they failed to prepare or to start it); the job
  // waits, naming them, when the other nodes cannot take it. Unknown names are ignored.
  std::vector<std::string> avoid_nodes;
};

struct NodeShare {
  std::string node;
  std::vector<int> device_indices;  // one per rank, in rank order
  std::vector<int> ranks;           // global ranks, ascending
};

struct JobPlacement {
  std::string job;
  std::vector<NodeShare> nodes;  // in order of their first rank
  size_t index = 0;              // the job's position in the queue given to Schedule()
};

struct Waiting {
  std::string job;
  std::string reason;  // e.g. "needs 8 CPU devices in groups of 2; 3 free on 2 ready nodes"
  // The queued job this one waits behind, which `reason` names ("behind jobs/x (priority 5)
  // ..."), or empty: a caller that shows the reason to another tenant hides that name.
  std::string behind;
  // Positions in the queue given to Schedule(): of this job, and of the job it waits behind
  // (kNone when `behind` is empty). A caller maps them back without looking names up.
  size_t index = 0;
  size_t behind_index = kNone;
  static constexpr size_t kNone = static_cast<size_t>(-1);
};

struct Decision {
  std::vector<JobPlacement> placed;  // in queue order (priority desc, sequence asc)
  std::vector<Waiting> waiting;      // in queue order; placed + waiting = the whole queue
};

// Decides which queued jobs start now and where. Pure and deterministic: the same input gives
// the same output, whatever the order of `nodes` and `queue`. Never fails: bad requests and
// bad snapshot entries end up in `waiting` or are ignored, with a reason. Thread-safe: it keeps
// no state between calls.
Decision Schedule(const std::vector<NodeSnapshot>& nodes, const std::vector<JobRequest>& queue);

}  // namespace loom::scheduler
