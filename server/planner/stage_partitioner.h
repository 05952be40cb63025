// The stage partitioner: contiguous pipeline stages that minimise the slowest stage, under a
// memory limit per device. Pure: the costs come from the time model's estimates or, later, from
// measured per-block times; the result is what the runtime executes (docs: LOOM_LAYOUT and the
// plan's stage boundaries).
//
// Problem. Blocks 0..L−1 with costs c_j ≥ 0 go to stages 0..p−1 in order, each stage a
// non-empty contiguous range [a_i, a_{i+1}). Stage i costs
//     C_i(a, b) = [i = 0]·first + [i = p−1]·last + Σ_{a ≤ j < b} c_j
// and holds
//     M_i(a, b) = fixed_i + Σ_{a ≤ j < b} (static_j + inflight_i · act_j)   bytes,
// which must not exceed the capacity. Minimise max_i C_i.
//
// Algorithm (exact). best[i][j] = the least bottleneck that covers blocks [0, j) with stages
// 0..i−1; best[i][j] = min over k of max(best[i−1][k], C_{i−1}(k, j)) over feasible (k, j).
// Every feasible partition decomposes this way, so best[p][L] is the optimum. Scanning k
// downward from j−1, C and M only grow (costs and bytes are non-negative), so the scan stops as
// soon as C_{i−1}(k, j) exceeds the best found or M_{i−1}(k, j) exceeds the capacity: nothing
// further down can improve the minimum or be feasible. This keeps the work near
// O(p·L·L/p) = O(L²) for balanced costs, O(p·L²) in the worst case. Ties are broken toward
// giving later stages more blocks, since under 1F1B earlier stages hold more micro-batches.
//
// Uniform blocks (every GPT block of a model has the same cost and size, the planner's case)
// take a shortcut: stage i with n blocks is worth α_i + n·w_i, so a bottleneck T is reachable
// iff n_i(T) = min(cap_i, ⌊(T − α_i)/w_i⌋) ≥ 1 for every stage and Σ n_i(T) ≥ L; T is found by
// bisection (O(p) per probe) to within 1e-13 of the optimum, instead of the O(p·L²) DP.
#pragma once

#include <limits>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::planner {

struct PartitionProblem {
  std::vector<double> block_cost;  // c_j, any unit (seconds per micro-batch for the planner)
  double first_stage_cost = 0;     // embedding, on stage 0
  double last_stage_cost = 0;      // final layernorm, head and loss, on stage p−1
  int num_stages = 1;

  // Memory constraint; leave the vectors empty for none. Sizes: L, L, p, p.
  std::vector<double> block_static_bytes;      // parameters, gradients, optimizer state
  std::vector<double> block_activation_bytes;  // per micro-batch in flight
  std::vector<double> stage_fixed_bytes;       // fixed_i (empty: 0)
  std::vector<double> stage_in_flight;         // inflight_i (empty: 1)
  double capacity_bytes = std::numeric_limits<double>::infinity();

  // Use the uniform-block shortcut when every block is alike (false: always the DP; tests
  // compare the two).
  bool allow_uniform_shortcut = true;
};

struct Partition {
  std::vector<int> blocks_per_stage;  // sums to L, every entry ≥ 1
  std::vector<double> stage_cost;     // C_i
  std::vector<double> stage_bytes;    // M_i (0 without a memory model)
  double bottleneck = 0;              // max_i C_i
  double peak_bytes = 0;              // max_i M_i
};

// The partition of least bottleneck whose every stage fits the capacity.
// INVALID_ARGUMENT for p < 1, p > L, or mismatched vector sizes; RESOURCE_EXHAUSTED when no
// partition fits (MinimizePeakMemory then says how much the best one needs).
absl::StatusOr<Partition> PartitionStages(const PartitionProblem& problem);

// The partition of least peak memory (max_i M_i), ignoring the capacity; ties by bottleneck
// are not resolved. Used to say how much memory a layout needs at best.
absl::StatusOr<Partition> MinimizePeakMemory(const PartitionProblem& problem);

// Cost and bytes of every stage of a given split (for checks and for measured re-plans).
Partition EvaluatePartition(const PartitionProblem& problem, std::vector<int> blocks_per_stage);

}  // namespace loom::planner
