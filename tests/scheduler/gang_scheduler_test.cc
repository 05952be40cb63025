// The gang scheduler, checked two ways: hand-written cases with exact expected placements and
// reasons, and invariants (all-or-nothing, no double booking, tensor groups inside a node,
// minimal node count, best fit, priority/FIFO without backfill, determinism) on many random
// snapshots.
#include "server/scheduler/gang_scheduler.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::scheduler {
namespace {

using ::testing::HasSubstr;
using v1::DEVICE_KIND_CPU;
using v1::DEVICE_KIND_GPU;

NodeSnapshot Node(std::string name, std::vector<int> free, int total,
                  v1::DeviceKind kind = DEVICE_KIND_CPU, bool ready = true) {
  NodeSnapshot n;
  n.name = "nodes/" + name;
  n.free_devices = std::move(free);
  n.total_devices = total;
  n.kind = kind;
  n.ready = ready;
  return n;
}

// A node with devices 0..free-1 free out of `total`.
NodeSnapshot FreeNode(std::string name, int free, int total,
                      v1::DeviceKind kind = DEVICE_KIND_CPU) {
  std::vector<int> f;
  for (int i = 0; i < free; ++i) f.push_back(i);
  return Node(std::move(name), std::move(f), total, kind);
}

JobRequest Job(std::string name, int devices, int tensor = 1, int priority = 0,
               int64_t sequence = 0, v1::DeviceKind kind = DEVICE_KIND_CPU) {
  JobRequest j;
  j.job = "jobs/" + name;
  j.devices = devices;
  j.tensor = tensor;
  j.priority = priority;
  j.sequence = sequence;
  j.kind = kind;
  return j;
}

// "a:0,1|b:2" — each share as node:devices, in rank order.
std::string Layout(const JobPlacement& p) {
  std::string s;
  for (const NodeShare& share : p.nodes) {
    if (!s.empty()) s += "|";
    s += share.node.substr(share.node.find('/') + 1) + ":";
    for (size_t i = 0; i < share.device_indices.size(); ++i) {
      if (i > 0) s += ",";
      s += std::to_string(share.device_indices[i]);
    }
  }
  return s;
}

// job name (without "jobs/") -> Layout, or "wait: <reason>".
std::map<std::string, std::string> Summary(const Decision& d) {
  std::map<std::string, std::string> out;
  for (const JobPlacement& p : d.placed) out[p.job.substr(5)] = Layout(p);
  for (const Waiting& w : d.waiting) out[w.job.substr(5)] = "wait: " + w.reason;
  return out;
}

struct Case {
  std::string name;
  std::vector<NodeSnapshot> nodes;
  std::vector<JobRequest> queue;
  std::map<std::string, std::string> expected;
};

std::vector<Case> HandWrittenCases() {
  std::vector<Case> cases;
  cases.push_back({"empty", {}, {}, {}});
  cases.push_back({"best fit on one node: fewest free devices that still fit",
                   {FreeNode("a", 8, 8), FreeNode("b", 3, 8), FreeNode("c", 4, 8)},
                   {Job("j1", 3, 1, 0, 1), Job("j2", 4, 1, 0, 2), Job("j3", 5, 1, 0, 3)},
                   {{"j1", "b:0,1,2"}, {"j2", "c:0,1,2,3"}, {"j3", "a:0,1,2,3,4"}}});
  cases.push_back({"ties in best fit go by name",
                   {FreeNode("z", 4, 4), FreeNode("m", 4, 4), FreeNode("q", 4, 4)},
                   {Job("j1", 2, 1, 0, 1), Job("j2", 4, 1, 0, 2)},
                   {{"j1", "m:0,1"}, {"j2", "q:0,1,2,3"}}});
  cases.push_back({"only free devices are given, lowest index first",
                   {Node("a", {7, 1, 5, 3}, 8)},
                   {Job("j1", 3)},
                   {{"j1", "a:1,3,5"}}});
  cases.push_back({"duplicate free indices are not given twice",
                   {Node("a", {0, 0, 1, 1}, 4)},
                   {Job("j1", 2, 1, 0, 1), Job("j2", 1, 1, 0, 2)},
                   {{"j1", "a:0,1"}, {"j2", "wait: needs 1 CPU device; 0 free on 1 ready node"}}});
  cases.push_back(
      {"spread over the fewest nodes; the last one is the best fit for the rest",
       {FreeNode("a", 6, 8), FreeNode("b", 6, 8), FreeNode("c", 2, 8), FreeNode("d", 4, 8)},
       {Job("j1", 10)},
       {{"j1", "a:0,1,2,3,4,5|d:0,1,2,3"}}});
  cases.push_back({"tensor groups stay inside a node",
                   {FreeNode("a", 3, 4), FreeNode("b", 3, 4), FreeNode("c", 2, 4)},
                   {Job("j1", 4, 2)},
                   {{"j1", "a:0,1|c:0,1"}}});
  cases.push_back({"enough devices but not in whole groups: the exact reason",
                   {FreeNode("a", 1, 4), FreeNode("b", 2, 4)},
                   {Job("j1", 8, 2)},
                   {{"j1",
                     "wait: needs 8 CPU devices in tensor groups of 2; 3 free on 2 ready "
                     "nodes"}}});
  cases.push_back({"free devices suffice, whole groups do not",
                   {FreeNode("a", 3, 4), FreeNode("b", 3, 4)},
                   {Job("j1", 6, 2)},
                   {{"j1",
                     "wait: needs 6 CPU devices in tensor groups of 2; 6 free on 2 ready "
                     "nodes, but only 2 whole groups of 2 fit"}}});
  cases.push_back({"a tensor group larger than every node spans nodes",
                   {FreeNode("a", 4, 4), FreeNode("b", 4, 4)},
                   {Job("j1", 8, 8)},
                   {{"j1", "a:0,1,2,3|b:0,1,2,3"}}});
  cases.push_back(
      {"lost nodes and nodes of another kind get nothing",
       {Node("a", {0, 1, 2, 3}, 4, DEVICE_KIND_CPU, /*ready=*/false),
        FreeNode("g", 4, 4, DEVICE_KIND_GPU), FreeNode("c", 1, 4)},
       {Job("j1", 2, 1, 0, 1), Job("j2", 4, 1, 0, 2, DEVICE_KIND_GPU)},
       {{"j1", "wait: needs 2 CPU devices; 1 free on 1 ready node"}, {"j2", "g:0,1,2,3"}}});
  cases.push_back(
      {"priority first, then sequence",
       {FreeNode("a", 2, 2)},
       {Job("old", 2, 1, 0, 1), Job("urgent", 2, 1, 5, 9)},
       // The old job waits for devices and, being last, blocks nobody.
       {{"urgent", "a:0,1"}, {"old", "wait: needs 2 CPU devices; 0 free on 1 ready node"}}});
  cases.push_back({"head of line: a waiting gang blocks smaller jobs behind it (no backfill)",
                   {FreeNode("a", 8, 8), FreeNode("b", 0, 8)},
                   {Job("big", 16, 1, 0, 1), Job("small", 1, 1, 0, 2), Job("low", 1, 1, -1, 0)},
                   {{"big", "wait: needs 16 CPU devices; 8 free on 2 ready nodes"},
                    {"small", "wait: behind jobs/big (priority 0) which waits for devices"},
                    {"low", "wait: behind jobs/big (priority 0) which waits for devices"}}});
  cases.push_back(
      {"blocking is per device kind",
       {FreeNode("c", 2, 8), FreeNode("g", 4, 8, DEVICE_KIND_GPU)},
       {Job("cpu-big", 4, 1, 0, 1), Job("gpu", 4, 1, 0, 2, DEVICE_KIND_GPU),
        Job("cpu-small", 1, 1, 0, 3)},
       {{"cpu-big", "wait: needs 4 CPU devices; 2 free on 1 ready node"},
        {"gpu", "g:0,1,2,3"},
        {"cpu-small", "wait: behind jobs/cpu-big (priority 0) which waits for devices"}}});
  cases.push_back(
      {"a job that can never fit waits without blocking",
       {FreeNode("a", 4, 8), FreeNode("b", 8, 8)},
       {Job("huge", 32, 1, 0, 1), Job("huge-tp", 18, 6, 0, 2), Job("ok", 2, 1, 0, 3),
        Job("no-gpu", 1, 1, 0, 4, DEVICE_KIND_GPU)},
       {{"huge",
         "wait: needs 32 CPU devices; the 2 ready CPU nodes hold 16 devices in all, so it "
         "cannot start until more nodes are ready"},
        {"huge-tp",
         "wait: needs 18 CPU devices in tensor groups of 6; the 2 ready CPU nodes hold "
         "16 devices in all, 2 whole groups of 6, so it cannot start until more nodes are "
         "ready"},
        {"ok", "a:0,1"},
        {"no-gpu", "wait: needs 1 GPU device; there is no ready GPU node"}}});
  cases.push_back({"invalid requests wait with their reason and block nobody",
                   {FreeNode("a", 4, 4)},
                   {Job("zero", 0, 1, 9, 1), Job("neg-tp", 4, -1, 9, 2), Job("odd-tp", 8, 3, 9, 3),
                    Job("no-kind", 1, 1, 9, 4, v1::DEVICE_KIND_UNSPECIFIED), Job("ok", 4, 2, 0, 5)},
                   {{"zero", "wait: invalid request: devices is 0; it must be >= 1"},
                    {"neg-tp", "wait: invalid request: tensor is -1; it must be >= 1"},
                    {"odd-tp", "wait: invalid request: tensor 3 does not divide devices 8"},
                    {"no-kind", "wait: invalid request: no device kind (GPU or CPU)"},
                    {"ok", "a:0,1,2,3"}}});
  cases.push_back({"a repeated node name counts once (the first entry)",
                   {FreeNode("a", 2, 2), FreeNode("a", 8, 8)},
                   {Job("j1", 2, 1, 0, 1), Job("j2", 1, 1, 0, 2)},
                   {{"j1", "a:0,1"}, {"j2", "wait: needs 1 CPU device; 0 free on 1 ready node"}}});
  return cases;
}

// A job held back by the gang ahead of it names that gang, and says which it is in `behind`,
// so that loomd can hide the name from another tenant.
TEST(GangSchedulerTest, AJobWaitingBehindAGangSaysWhichGang) {
  const Decision d =
      Schedule({FreeNode("a", 8, 16)}, {Job("big", 16, 1, 0, 1), Job("small", 1, 1, 0, 2)});
  ASSERT_EQ(d.waiting.size(), 2u);
  EXPECT_EQ(d.waiting[0].job, "jobs/big");
  EXPECT_EQ(d.waiting[0].behind, "");
  EXPECT_EQ(d.waiting[1].job, "jobs/small");
  EXPECT_EQ(d.waiting[1].behind, "jobs/big");
  EXPECT_THAT(d.waiting[1].reason, HasSubstr("behind jobs/big"));
}

TEST(GangSchedulerTest, HandWrittenCases) {
  for (const Case& c : HandWrittenCases()) {
    SCOPED_TRACE(c.name);
    const Decision d = Schedule(c.nodes, c.queue);
    const std::map<std::string, std::string> got = Summary(d);
    EXPECT_EQ(got, c.expected);
    EXPECT_EQ(d.placed.size() + d.waiting.size(), c.queue.size());
  }
}

TEST(GangSchedulerTest, RanksAreNumberedNodeByNodeInRankOrder) {
  const Decision d =
      Schedule({FreeNode("a", 2, 4), FreeNode("b", 4, 4), FreeNode("c", 2, 4)}, {Job("j", 8, 2)});
  ASSERT_EQ(d.placed.size(), 1u);
  const JobPlacement& p = d.placed[0];
  ASSERT_EQ(p.nodes.size(), 3u);
  EXPECT_EQ(p.nodes[0].node, "nodes/b");
  EXPECT_EQ(p.nodes[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(p.nodes[1].node, "nodes/a");
  EXPECT_EQ(p.nodes[1].ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(p.nodes[2].node, "nodes/c");
  EXPECT_EQ(p.nodes[2].ranks, (std::vector<int>{6, 7}));
}

TEST(GangSchedulerTest, OutputIsInQueueOrder) {
  const Decision d = Schedule(
      {FreeNode("a", 8, 8)},
      {Job("c", 1, 1, 0, 3), Job("a", 1, 1, 0, 1), Job("b", 1, 1, 1, 2), Job("x", 100, 1, 0, 4)});
  ASSERT_EQ(d.placed.size(), 3u);
  EXPECT_EQ(d.placed[0].job, "jobs/b");
  EXPECT_EQ(d.placed[1].job, "jobs/a");
  EXPECT_EQ(d.placed[2].job, "jobs/c");
}

// A job avoids the nodes that failed it: best fit would pick b, which it avoids, so it goes to
// a; another job may still use b; a job that fits only on avoided nodes waits naming them and
// does not block the job behind it.
TEST(GangSchedulerTest, AvoidedNodesAreHiddenFromThatJobOnly) {
  JobRequest avoiding = Job("j1", 2, 1, 0, 1);
  avoiding.avoid_nodes = {"nodes/b", "nodes/unknown"};
  JobRequest stuck = Job("j2", 4, 1, 0, 2);
  stuck.avoid_nodes = {"nodes/a"};
  const Decision d = Schedule({FreeNode("a", 4, 4), FreeNode("b", 2, 2)},
                              {avoiding, stuck, Job("j3", 2, 1, 0, 3), Job("j4", 2, 1, 0, 4)});
  const std::map<std::string, std::string> summary = Summary(d);
  EXPECT_EQ(summary.at("j1"), "a:0,1");
  EXPECT_THAT(summary.at("j2"), HasSubstr("avoiding 1 node that failed to prepare or start it"));
  EXPECT_EQ(summary.at("j3"), "a:2,3");
  EXPECT_EQ(summary.at("j4"), "b:0,1");
}

// ---------------------------------------------------------------------------------------------
// Properties on random snapshots.

struct Scenario {
  std::vector<NodeSnapshot> nodes;
  std::vector<JobRequest> queue;
};

Scenario RandomScenario(std::mt19937& rng) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Scenario s;
  const int n_nodes = uniform(0, 16);
  for (int i = 0; i < n_nodes; ++i) {
    const int total = std::vector<int>{1, 2, 4, 8, 8, 8, 16}[uniform(0, 6)];
    std::vector<int> free;
    for (int d = 0; d < total; ++d) {
      if (uniform(0, 3) != 0) free.push_back(d);
    }
    if (!free.empty() && uniform(0, 9) == 0) free.push_back(free.front());  // a duplicate
    std::shuffle(free.begin(), free.end(), rng);
    NodeSnapshot n = Node("n" + std::to_string(i), free, total,
                          uniform(0, 4) == 0 ? DEVICE_KIND_CPU : DEVICE_KIND_GPU,
                          /*ready=*/uniform(0, 9) != 0);
    s.nodes.push_back(std::move(n));
  }
  const int n_jobs = uniform(0, 30);
  for (int i = 0; i < n_jobs; ++i) {
    const int tensor = std::vector<int>{1, 1, 2, 4, 8}[uniform(0, 4)];
    int devices = tensor * std::vector<int>{1, 1, 2, 3, 4, 8}[uniform(0, 5)];
    if (uniform(0, 30) == 0) devices += 1;  // sometimes invalid
    s.queue.push_back(Job("j" + std::to_string(i), devices, tensor, uniform(0, 2),
                          /*sequence=*/uniform(0, 1000) * 100 + i,
                          uniform(0, 4) == 0 ? DEVICE_KIND_CPU : DEVICE_KIND_GPU));
  }
  return s;
}

bool Before(const JobRequest& a, const JobRequest& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.sequence != b.sequence) return a.sequence < b.sequence;
  return a.job < b.job;
}

// The minimal number of nodes holding `groups` groups of `unit` given free counts.
int MinNodes(std::vector<int> free, int unit, int groups) {
  std::sort(free.rbegin(), free.rend());
  int sum = 0;
  for (size_t k = 0; k < free.size(); ++k) {
    sum += free[k] / unit;
    if (sum >= groups) return static_cast<int>(k) + 1;
  }
  return -1;
}

// Replays the decision in queue order against the snapshot and checks every guarantee.
void CheckProperties(const Scenario& s, const Decision& d) {
  // Eligible nodes: ready, first entry of a name; free sets without duplicates.
  std::map<std::string, const NodeSnapshot*> nodes;
  std::map<std::string, std::set<int>> free;
  std::map<std::string, int> initial_free;
  for (const NodeSnapshot& n : s.nodes) {
    if (!n.ready || nodes.count(n.name)) continue;
    nodes[n.name] = &n;
    free[n.name] = std::set<int>(n.free_devices.begin(), n.free_devices.end());
    initial_free[n.name] = static_cast<int>(free[n.name].size());
  }
  std::vector<JobRequest> order = s.queue;
  std::sort(order.begin(), order.end(), Before);
  std::map<std::string, const JobPlacement*> placed;
  for (const JobPlacement& p : d.placed) placed[p.job] = &p;
  std::map<std::string, std::string> waiting;
  for (const Waiting& w : d.waiting) waiting[w.job] = w.reason;
  ASSERT_EQ(placed.size() + waiting.size(), s.queue.size());

  // Every index names the request it stands for (loomd maps decisions back by them).
  for (const JobPlacement& p : d.placed) {
    ASSERT_LT(p.index, s.queue.size());
    EXPECT_EQ(s.queue[p.index].job, p.job);
  }
  for (const Waiting& w : d.waiting) {
    ASSERT_LT(w.index, s.queue.size());
    EXPECT_EQ(s.queue[w.index].job, w.job);
    if (w.behind.empty()) {
      EXPECT_EQ(w.behind_index, Waiting::kNone);
    } else {
      ASSERT_LT(w.behind_index, s.queue.size());
      EXPECT_EQ(s.queue[w.behind_index].job, w.behind);
    }
  }

  // Output order follows queue order.
  std::vector<std::string> expected_placed_order;
  for (const JobRequest& j : order) {
    if (placed.count(j.job)) expected_placed_order.push_back(j.job);
  }
  std::vector<std::string> placed_order;
  for (const JobPlacement& p : d.placed) placed_order.push_back(p.job);
  EXPECT_EQ(placed_order, expected_placed_order);

  std::set<int> blocked_kinds;
  for (const JobRequest& job : order) {
    SCOPED_TRACE(job.job);
    // The eligible nodes of this job's kind, as they stand now.
    int max_capacity = 0;
    std::vector<int> free_counts;
    std::map<std::string, int> free_now;
    for (const auto& [name, n] : nodes) {
      if (n->kind != job.kind) continue;
      max_capacity = std::max<int>(
          max_capacity, std::max<int>(n->total_devices, static_cast<int>(free[name].size())));
      free_counts.push_back(static_cast<int>(free[name].size()));
      free_now[name] = static_cast<int>(free[name].size());
    }
    const bool valid = job.devices >= 1 && job.tensor >= 1 && job.devices % job.tensor == 0 &&
                       (job.kind == DEVICE_KIND_CPU || job.kind == DEVICE_KIND_GPU);
    const int unit = valid && job.tensor <= max_capacity ? job.tensor : 1;
    // Groups the job could get if every eligible node were idle.
    int64_t idle_groups = 0;
    for (const auto& [name, n] : nodes) {
      if (n->kind == job.kind) idle_groups += std::max(n->total_devices, initial_free[name]) / unit;
    }
    const bool ever_fits = valid && idle_groups >= job.devices / unit;
    auto it = placed.find(job.job);
    if (it == placed.end()) {
      const std::string& reason = waiting.at(job.job);
      if (!valid) {
        EXPECT_THAT(reason, HasSubstr("invalid request"));
      } else if (!ever_fits) {
        EXPECT_TRUE(reason.find("cannot start until more nodes are ready") != std::string::npos ||
                    reason.find("there is no ready") != std::string::npos)
            << reason;
      } else if (blocked_kinds.count(job.kind)) {
        EXPECT_THAT(reason, HasSubstr("behind jobs/"));
      } else {
        // It waits for devices: it really does not fit now, and it blocks its kind.
        EXPECT_EQ(MinNodes(free_counts, unit, job.devices / unit), -1) << reason;
        EXPECT_THAT(reason, HasSubstr("needs " + std::to_string(job.devices)));
        blocked_kinds.insert(job.kind);
      }
      continue;
    }
    // Placed: valid, not blocked (no backfill past a waiting job of the same kind).
    ASSERT_TRUE(ever_fits);
    EXPECT_FALSE(blocked_kinds.count(job.kind)) << "backfilled past a waiting job";
    const JobPlacement& p = *it->second;
    int next_rank = 0;
    std::vector<std::string> rank_node(job.devices);
    for (const NodeShare& share : p.nodes) {
      ASSERT_TRUE(nodes.count(share.node)) << share.node << " is not a ready node";
      EXPECT_EQ(nodes[share.node]->kind, job.kind);
      ASSERT_EQ(share.device_indices.size(), share.ranks.size());
      ASSERT_FALSE(share.ranks.empty());
      for (size_t i = 0; i < share.ranks.size(); ++i) {
        // Ranks contiguous across shares, in order.
        EXPECT_EQ(share.ranks[i], next_rank++);
        // Each device was free and is now taken: never given twice.
        EXPECT_EQ(free[share.node].erase(share.device_indices[i]), 1u)
            << share.node << " device " << share.device_indices[i] << " not free";
        if (share.ranks[i] < job.devices) rank_node[share.ranks[i]] = share.node;
      }
    }
    EXPECT_EQ(next_rank, job.devices) << "all or nothing";
    // Tensor groups inside a node whenever a group fits in a node.
    if (job.tensor <= max_capacity) {
      for (int r = 0; r < job.devices; ++r) {
        EXPECT_EQ(rank_node[r], rank_node[r - r % job.tensor]) << "group split at rank " << r;
      }
    }
    // As few nodes as possible; a single-node job goes to the best fit.
    EXPECT_EQ(static_cast<int>(p.nodes.size()), MinNodes(free_counts, unit, job.devices / unit));
    if (p.nodes.size() == 1) {
      for (const auto& [name, f] : free_now) {
        if (f >= job.devices) {
          EXPECT_GE(f, free_now[p.nodes[0].node]) << "not the best fit";
        }
      }
    }
  }
}

TEST(GangSchedulerPropertyTest, RandomSnapshots) {
  std::mt19937 rng(20240601);
  // Coverage: the generator must exercise every branch the properties talk about.
  int placed = 0, multi_node = 0, grouped_multi_node = 0, waiting_for_devices = 0, behind = 0,
      never = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    Scenario s = RandomScenario(rng);
    const Decision d = Schedule(s.nodes, s.queue);
    CheckProperties(s, d);
    for (const JobPlacement& p : d.placed) {
      ++placed;
      multi_node += p.nodes.size() > 1;
      grouped_multi_node +=
          p.nodes.size() > 1 && p.nodes[0].ranks.size() > 1 && p.nodes[0].ranks.size() % 2 == 0;
    }
    for (const Waiting& w : d.waiting) {
      behind += w.reason.starts_with("behind ");
      never += w.reason.find("cannot start") != std::string::npos;
      waiting_for_devices += w.reason.find(" free on ") != std::string::npos;
    }
    // Deterministic whatever the input order.
    Scenario shuffled = s;
    std::shuffle(shuffled.nodes.begin(), shuffled.nodes.end(), rng);
    std::shuffle(shuffled.queue.begin(), shuffled.queue.end(), rng);
    // Repeated node names make "first entry wins" order-dependent; compare only without them.
    std::set<std::string> names;
    for (const NodeSnapshot& n : s.nodes) names.insert(n.name);
    if (names.size() == s.nodes.size()) {
      EXPECT_EQ(Summary(Schedule(shuffled.nodes, shuffled.queue)), Summary(d));
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(placed, 5000);
  EXPECT_GT(multi_node, 500);
  EXPECT_GT(grouped_multi_node, 100);
  EXPECT_GT(waiting_for_devices, 1000);
  EXPECT_GT(behind, 5000);
  EXPECT_GT(never, 500);
  std::printf("placed %d (multi-node %d, grouped %d); waiting: devices %d, behind %d, never %d\n",
              placed, multi_node, grouped_multi_node, waiting_for_devices, behind, never);
}

}  // namespace
}  // namespace loom::scheduler
