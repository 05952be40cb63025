#include "server/scheduler/gang_scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

namespace loom::scheduler {
namespace {

// One eligible (ready) node during a decision. `free` shrinks as jobs are placed.
struct NodeState {
  const NodeSnapshot* snap = nullptr;
  std::vector<int> free;  // ascending, unique, non-negative
  int capacity = 0;       // devices the node has when idle: max(total_devices, free at start)
};

// The ready nodes of one device kind. Node ids index `Scheduler::nodes_`, which is sorted by
// name, so iterating a bucket visits nodes in name order.
struct Pool {
  std::vector<int> ids;
  std::vector<std::set<int>> by_free;  // by_free[f]: ids of nodes with exactly f free devices
  int max_capacity = 0;
  int64_t free_total = 0;
};

const char* KindName(v1::DeviceKind kind) {
  switch (kind) {
    case v1::DEVICE_KIND_GPU:
      return "GPU";
    case v1::DEVICE_KIND_CPU:
      return "CPU";
    default:
      return "UNSPECIFIED";
  }
}

std::string Plural(int64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

class Scheduler {
 public:
  explicit Scheduler(const std::vector<NodeSnapshot>& nodes);
  Decision Run(const std::vector<JobRequest>& queue);

 private:
  // Why `job` cannot be valid, or empty.
  static std::string Invalid(const JobRequest& job);
  // The device unit of a job on `pool`: tp when a tensor group fits in a node, else 1.
  static int Unit(const JobRequest& job, const Pool& pool) {
    return job.tensor <= pool.max_capacity ? job.tensor : 1;
  }
  // Whether the job would fit if every node of the pool were idle.
  bool FitsWhenIdle(const JobRequest& job, const Pool& pool);
  // Places the job on the pool now, or returns nullopt and changes nothing.
  std::optional<JobPlacement> TryPlace(const JobRequest& job, Pool& pool);
  void Take(int id, int count, Pool& pool, int first_rank, JobPlacement& placement);
  std::string NeedsText(const JobRequest& job, const Pool* pool) const;
  std::string WaitReason(const JobRequest& job, const Pool& pool) const;
  std::string NeverReason(const JobRequest& job, const Pool* pool) const;

  std::vector<NodeState> nodes_;                        // ready nodes, sorted by name
  std::map<int, Pool> pools_;                           // by device kind
  std::map<std::pair<int, int>, int64_t> idle_groups_;  // (kind, unit) -> groups when idle
  std::vector<char> chosen_;  // scratch mark per node id, all zero between jobs

  // Hides the job's avoided nodes of `pool` from the free buckets (Unhide puts them back) and
  // returns their ids.
  std::vector<int> Hide(const JobRequest& job, Pool& pool);
  void Unhide(const std::vector<int>& hidden, Pool& pool);
};

std::vector<int> Scheduler::Hide(const JobRequest& job, Pool& pool) {
  std::vector<int> hidden;
  for (const std::string& name : job.avoid_nodes) {
    auto it =
        std::lower_bound(nodes_.begin(), nodes_.end(), name,
                         [](const NodeState& n, const std::string& v) { return n.snap->name < v; });
    if (it == nodes_.end() || it->snap->name != name || it->snap->kind != job.kind) continue;
    const int id = static_cast<int>(it - nodes_.begin());
    if (std::find(hidden.begin(), hidden.end(), id) != hidden.end()) continue;
    if (pool.by_free[it->free.size()].erase(id) == 0) continue;
    pool.free_total -= static_cast<int64_t>(it->free.size());
    hidden.push_back(id);
  }
  return hidden;
}

void Scheduler::Unhide(const std::vector<int>& hidden, Pool& pool) {
  for (int id : hidden) {
    pool.by_free[nodes_[id].free.size()].insert(id);
    pool.free_total += static_cast<int64_t>(nodes_[id].free.size());
  }
}

Scheduler::Scheduler(const std::vector<NodeSnapshot>& nodes) {
  std::vector<const NodeSnapshot*> ready;
  for (const NodeSnapshot& n : nodes) {
    if (n.ready) ready.push_back(&n);
  }
  // Sort by name; stable so that the first of duplicate names wins, then drop the duplicates.
  std::stable_sort(ready.begin(), ready.end(),
                   [](const NodeSnapshot* a, const NodeSnapshot* b) { return a->name < b->name; });
  for (const NodeSnapshot* n : ready) {
    if (!nodes_.empty() && nodes_.back().snap->name == n->name) continue;
    NodeState s;
    s.snap = n;
    for (int d : n->free_devices) {
      if (d >= 0) s.free.push_back(d);
    }
    std::sort(s.free.begin(), s.free.end());
    s.free.erase(std::unique(s.free.begin(), s.free.end()), s.free.end());
    s.capacity = std::max<int>(n->total_devices, static_cast<int>(s.free.size()));
    nodes_.push_back(std::move(s));
  }
  for (int id = 0; id < static_cast<int>(nodes_.size()); ++id) {
    Pool& pool = pools_[nodes_[id].snap->kind];
    pool.ids.push_back(id);
    pool.max_capacity = std::max(pool.max_capacity, nodes_[id].capacity);
  }
  for (auto& [kind, pool] : pools_) {
    int max_free = 0;
    for (int id : pool.ids) max_free = std::max<int>(max_free, nodes_[id].free.size());
    pool.by_free.resize(max_free + 1);
    for (int id : pool.ids) {
      pool.by_free[nodes_[id].free.size()].insert(id);
      pool.free_total += nodes_[id].free.size();
    }
  }
  chosen_.assign(nodes_.size(), 0);
}

std::string Scheduler::Invalid(const JobRequest& job) {
  if (job.kind != v1::DEVICE_KIND_GPU && job.kind != v1::DEVICE_KIND_CPU) {
    return "invalid request: no device kind (GPU or CPU)";
  }
  if (job.devices < 1) {
    return "invalid request: devices is " + std::to_string(job.devices) + "; it must be >= 1";
  }
  if (job.tensor < 1) {
    return "invalid request: tensor is " + std::to_string(job.tensor) + "; it must be >= 1";
  }
  if (job.devices % job.tensor != 0) {
    return "invalid request: tensor " + std::to_string(job.tensor) + " does not divide devices " +
           std::to_string(job.devices);
  }
  return "";
}

bool Scheduler::FitsWhenIdle(const JobRequest& job, const Pool& pool) {
  const int unit = Unit(job, pool);
  auto [it, inserted] = idle_groups_.try_emplace({job.kind, unit}, 0);
  if (inserted) {
    for (int id : pool.ids) it->second += nodes_[id].capacity / unit;
  }
  return it->second >= job.devices / unit;
}

void Scheduler::Take(int id, int count, Pool& pool, int first_rank, JobPlacement& placement) {
  NodeState& node = nodes_[id];
  const int before = static_cast<int>(node.free.size());
  NodeShare share;
  share.node = node.snap->name;
  share.device_indices.assign(node.free.begin(), node.free.begin() + count);
  for (int r = 0; r < count; ++r) share.ranks.push_back(first_rank + r);
  node.free.erase(node.free.begin(), node.free.begin() + count);
  pool.by_free[before].erase(id);
  pool.by_free[before - count].insert(id);
  pool.free_total -= count;
  placement.nodes.push_back(std::move(share));
}

std::optional<JobPlacement> Scheduler::TryPlace(const JobRequest& job, Pool& pool) {
  const int max_free = static_cast<int>(pool.by_free.size()) - 1;
  if (job.devices > pool.free_total) return std::nullopt;
  JobPlacement placement;
  placement.job = job.job;

  // 1. One node: the best fit (fewest free devices that still fit; a bucket is in name order).
  for (int f = job.devices; f <= max_free; ++f) {
    if (!pool.by_free[f].empty()) {
      Take(*pool.by_free[f].begin(), job.devices, pool, 0, placement);
      return placement;
    }
  }

  // 2. Spread: the fewest nodes are the ones with the most free groups.
  const int unit = Unit(job, pool);
  const int64_t groups = job.devices / unit;
  std::vector<int> chosen;  // node ids; chosen_[id] marks them
  std::vector<int64_t> caps;
  int64_t sum = 0;
  for (int f = max_free; f >= unit && sum < groups; --f) {
    for (int id : pool.by_free[f]) {
      chosen.push_back(id);
      caps.push_back(f / unit);
      sum += f / unit;
      if (sum >= groups) break;
    }
  }
  if (sum < groups) return std::nullopt;

  // The last node only needs the remainder: swap in the best fit for it among the others.
  const int64_t before_last = sum - caps.back();
  const int64_t remainder = groups - before_last;
  for (size_t i = 0; i + 1 < chosen.size(); ++i) chosen_[chosen[i]] = 1;
  bool replaced = false;
  for (int64_t f = remainder * unit; f <= max_free && !replaced; ++f) {
    for (int id : pool.by_free[f]) {
      if (chosen_[id]) continue;
      chosen.back() = id;
      replaced = true;
      break;
    }
  }
  for (size_t i = 0; i + 1 < chosen.size(); ++i) chosen_[chosen[i]] = 0;

  int rank = 0;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int count = static_cast<int>(i + 1 < chosen.size() ? caps[i] * unit : remainder * unit);
    Take(chosen[i], count, pool, rank, placement);
    rank += count;
  }
  return placement;
}

std::string Scheduler::NeedsText(const JobRequest& job, const Pool* pool) const {
  std::string s = "needs " + Plural(job.devices, std::string(KindName(job.kind)) + " device",
                                    std::string(KindName(job.kind)) + " devices");
  if (job.tensor > 1) {
    s += " in tensor groups of " + std::to_string(job.tensor);
    if (pool != nullptr && Unit(job, *pool) == 1) {
      s += " (larger than any node, so groups span nodes)";
    }
  }
  return s;
}

std::string Scheduler::WaitReason(const JobRequest& job, const Pool& pool) const {
  std::string s = NeedsText(job, &pool) + "; " + std::to_string(pool.free_total) + " free on " +
                  Plural(static_cast<int64_t>(pool.ids.size()), "ready node", "ready nodes");
  const int unit = Unit(job, pool);
  if (pool.free_total >= job.devices && unit > 1) {
    int64_t groups = 0;
    for (size_t f = unit; f < pool.by_free.size(); ++f) {
      groups += static_cast<int64_t>(f / unit) * static_cast<int64_t>(pool.by_free[f].size());
    }
    s += ", but only " + Plural(groups, "whole group", "whole groups") + " of " +
         std::to_string(unit) + " fit";
  }
  return s;
}

std::string Scheduler::NeverReason(const JobRequest& job, const Pool* pool) const {
  const std::string kind = KindName(job.kind);
  if (pool == nullptr) return NeedsText(job, nullptr) + "; there is no ready " + kind + " node";
  int64_t capacity = 0;
  int64_t groups = 0;
  const int unit = Unit(job, *pool);
  for (int id : pool->ids) {
    capacity += nodes_[id].capacity;
    groups += nodes_[id].capacity / unit;
  }
  std::string s = NeedsText(job, pool) + "; the " +
                  Plural(static_cast<int64_t>(pool->ids.size()), "ready " + kind + " node",
                         "ready " + kind + " nodes") +
                  " hold " + Plural(capacity, "device", "devices") + " in all";
  if (unit > 1) {
    s += ", " + Plural(groups, "whole group", "whole groups") + " of " + std::to_string(unit);
  }
  return s + ", so it cannot start until more nodes are ready";
}

Decision Scheduler::Run(const std::vector<JobRequest>& queue) {
  std::vector<const JobRequest*> order;
  order.reserve(queue.size());
  for (const JobRequest& j : queue) order.push_back(&j);
  std::sort(order.begin(), order.end(), [](const JobRequest* a, const JobRequest* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->sequence != b->sequence) return a->sequence < b->sequence;
    return a->job < b->job;
  });

  Decision decision;
  decision.waiting.reserve(queue.size());
  const auto index = [&](const JobRequest* job) { return static_cast<size_t>(job - queue.data()); };
  const auto wait = [&](const JobRequest* job, std::string reason) {
    decision.waiting.push_back({job->job, std::move(reason), "", index(job)});
  };
  // By kind: the gang that waits for devices, which later jobs of that kind wait behind, and
  // the reason they all get (built once: in a deep queue nearly every job gets it).
  struct Blocker {
    const JobRequest* job;
    std::string reason;
  };
  std::map<int, Blocker> blocked_by;
  for (const JobRequest* job : order) {
    if (std::string invalid = Invalid(*job); !invalid.empty()) {
      wait(job, std::move(invalid));
      continue;
    }
    auto pit = pools_.find(job->kind);
    Pool* pool = pit == pools_.end() ? nullptr : &pit->second;
    if (pool == nullptr || !FitsWhenIdle(*job, *pool)) {
      wait(job, NeverReason(*job, pool));
      continue;
    }
    if (auto bit = blocked_by.find(job->kind); bit != blocked_by.end()) {
      const Blocker& ahead = bit->second;
      decision.waiting.push_back(
          {job->job, ahead.reason, ahead.job->job, index(job), index(ahead.job)});
      continue;
    }
    const std::vector<int> hidden = Hide(*job, *pool);
    std::optional<JobPlacement> p = TryPlace(*job, *pool);
    Unhide(hidden, *pool);
    if (p.has_value()) {
      p->index = index(job);
      decision.placed.push_back(std::move(*p));
      continue;
    }
    if (!hidden.empty()) {
      // Another node may free up or return; the job behind need not wait for that.
      wait(job, WaitReason(*job, *pool) + "; avoiding " +
                    Plural(static_cast<int64_t>(hidden.size()), "node", "nodes") +
                    " that failed to prepare or start it");
      continue;
    }
    wait(job, WaitReason(*job, *pool));
    blocked_by[job->kind] = {job, "behind " + job->job + " (priority " +
                                      std::to_string(job->priority) + ") which waits for devices"};
  }
  return decision;
}

}  // namespace

Decision Schedule(const std::vector<NodeSnapshot>& nodes, const std::vector<JobRequest>& queue) {
  return Scheduler(nodes).Run(queue);
}

}  // namespace loom::scheduler
