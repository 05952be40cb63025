// Scheduler benchmark: time per placement decision with 1,000 nodes x 8 GPUs and 10,000 queued
// jobs, in process. Plain main; prints a table.
//
// A "decision" is one call of loom::scheduler::Schedule() with the whole cluster snapshot and the
// whole queue — what the job manager runs on every scheduling pass (a job queued, a job
// finished, a node joined or was lost). The inputs are built before timing starts; the time
// covers sorting the queue, indexing the nodes, placing every job that can start and writing a
// reason for every job that waits. Each scenario runs once to warm up, then `kReps` times; the
// table gives the median and the minimum, and the median divided by the queue length (the cost
// per queued job) and by the number of placements.
//
//   usage: scheduler_bench [repetitions]   (default 21)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "server/scheduler/gang_scheduler.h"

namespace {

using loom::scheduler::Decision;
using loom::scheduler::JobRequest;
using loom::scheduler::NodeSnapshot;
using loom::v1::DEVICE_KIND_GPU;

constexpr int kNodes = 1000;
constexpr int kGpusPerNode = 8;
constexpr int kQueued = 10000;

// 1,000 GPU nodes of 8; each device is free with probability `free_fraction`.
std::vector<NodeSnapshot> Cluster(double free_fraction, std::mt19937& rng) {
  std::bernoulli_distribution is_free(free_fraction);
  std::vector<NodeSnapshot> nodes;
  for (int i = 0; i < kNodes; ++i) {
    NodeSnapshot n;
    n.name = "nodes/gpu-" + std::to_string(100000 + i);
    n.kind = DEVICE_KIND_GPU;
    n.total_devices = kGpusPerNode;
    for (int d = 0; d < kGpusPerNode; ++d) {
      if (free_fraction >= 1.0 || is_free(rng)) n.free_devices.push_back(d);
    }
    nodes.push_back(std::move(n));
  }
  return nodes;
}

// 10,000 GPU jobs; `size(i)` returns (devices, tensor) of job i.
std::vector<JobRequest> Queue(const std::function<std::pair<int, int>(int)>& size,
                              std::mt19937& rng) {
  std::uniform_int_distribution<int> priority(0, 3);
  std::vector<JobRequest> queue;
  for (int i = 0; i < kQueued; ++i) {
    JobRequest j;
    j.job = "jobs/j" + std::to_string(i);
    j.priority = priority(rng);
    j.sequence = i;
    j.kind = DEVICE_KIND_GPU;
    std::tie(j.devices, j.tensor) = size(i);
    queue.push_back(std::move(j));
  }
  std::shuffle(queue.begin(), queue.end(), rng);  // the scheduler sorts; do not hand it sorted
  return queue;
}

struct Scenario {
  std::string name;
  std::vector<NodeSnapshot> nodes;
  std::vector<JobRequest> queue;
};

std::vector<Scenario> Scenarios() {
  std::mt19937 rng(7);
  std::vector<Scenario> out;
  // A realistic mix: mostly small jobs, some whole-node and multi-node gangs.
  auto mixed = [&rng](int) -> std::pair<int, int> {
    static const std::vector<std::pair<int, int>> kSizes = {
        {1, 1}, {1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 4}, {8, 8}, {8, 4}, {16, 8}, {32, 8}, {64, 8}};
    return kSizes[std::uniform_int_distribution<size_t>(0, kSizes.size() - 1)(rng)];
  };
  out.push_back({"idle cluster, mixed sizes", Cluster(1.0, rng), Queue(mixed, rng)});
  out.push_back({"60% free (fragmented), mixed", Cluster(0.6, rng), Queue(mixed, rng)});
  out.push_back({"idle cluster, 10k x 1 GPU", Cluster(1.0, rng),
                 Queue(
                     [](int) {
                       return std::pair{1, 1};
                     },
                     rng)});
  out.push_back({"idle, 10k x 8 GPU tp=8", Cluster(1.0, rng),
                 Queue(
                     [](int) {
                       return std::pair{8, 8};
                     },
                     rng)});
  out.push_back({"40% free, 10k x 24 GPU tp=2 (spread)", Cluster(0.4, rng),
                 Queue(
                     [](int) {
                       return std::pair{24, 2};
                     },
                     rng)});
  out.push_back({"full cluster, all wait", Cluster(0.0, rng), Queue(mixed, rng)});
  return out;
}

double Millis(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  std::printf("Gang scheduler: %d nodes x %d GPUs, %d queued jobs, %d repetitions per row\n",
              kNodes, kGpusPerNode, kQueued, reps);
  std::printf("decision = one Schedule() call over the whole snapshot and queue\n\n");
  std::printf("%-38s %7s %7s %7s %10s %10s %12s %12s\n", "scenario", "free", "placed", "waiting",
              "median ms", "min ms", "us/queued", "us/placed");
  for (const Scenario& s : Scenarios()) {
    size_t free = 0;
    for (const NodeSnapshot& n : s.nodes) free += n.free_devices.size();
    Decision d = loom::scheduler::Schedule(s.nodes, s.queue);  // warm-up
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      const auto start = std::chrono::steady_clock::now();
      d = loom::scheduler::Schedule(s.nodes, s.queue);
      times.push_back(Millis(std::chrono::steady_clock::now() - start));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    std::printf(
        "%-38s %7zu %7zu %7zu %10.3f %10.3f %12.3f %12s\n", s.name.c_str(), free, d.placed.size(),
        d.waiting.size(), median, times.front(), 1000.0 * median / s.queue.size(),
        d.placed.empty() ? "-"
                         : std::to_string(1000.0 * median / d.placed.size()).substr(0, 8).c_str());
  }
  return 0;
}
