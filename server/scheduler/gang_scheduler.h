// The gang scheduler: a pure function from a cluster snapshot and the queue to placements.
// No RPC, no clock, no logging: the job manager takes a snapshot under its lock, calls
// Schedule(), and applies the decision. Guarantees (tested from tables):
//  - all or nothing: a job gets every device it asks for at once, or none;
//  - no device is ever given twice (nor one that the snapshot shows as busy);
//  - order: priority descending, then sequence ascending (FIFO);
//  - packing: a job's ranks sit on as few nodes as possible;
//  - tensor groups: ranks r .. r+tp-1 (tp fastest in rank order) share a node whenever tp fits
//    in a node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/v1/node.pb.h"

namespace loom::scheduler {

struct NodeSnapshot {
  std::string name;  // nodes/{node}
  bool ready = true;  // LOST nodes get nothing
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  std::vector<int> free_devices;  // device indices free now, ascending
  int total_devices = 0;
};

struct JobRequest {
  std::string job;  // jobs/{job}
  int priority = 0;
  int64_t sequence = 0;  // store order, FIFO within a priority
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  int devices = 1;
  int tensor = 1;  // tensor-parallel size; divides `devices`
};

struct NodeShare {
  std::string node;
  std::vector<int> device_indices;  // one per rank, in rank order
  std::vector<int> ranks;           // global ranks, ascending
};

struct JobPlacement {
  std::string job;
  std::vector<NodeShare> nodes;  // in order of their first rank
};

struct Waiting {
  std::string job;
  std::string reason;  // e.g. "needs 8 CPU devices in groups of 2; 3 free on 2 ready nodes"
};

struct Decision {
  std::vector<JobPlacement> placed;
  std::vector<Waiting> waiting;
};

Decision Schedule(const std::vector<NodeSnapshot>& nodes, const std::vector<JobRequest>& queue);

}  // namespace loom::scheduler
