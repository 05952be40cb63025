// The stage partitioner against brute force over every split of small random cases, for both
// the general dynamic programme and the uniform-block shortcut.
#include "server/planner/stage_partitioner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

namespace loom::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Brute {
  double bottleneck = kInf;  // least bottleneck over splits that fit
  double least_peak = kInf;  // least peak memory over all splits
};

// Enumerates every composition of L into p positive parts.
Brute BruteForce(const PartitionProblem& p) {
  const int n = static_cast<int>(p.block_cost.size());
  Brute best;
  std::vector<int> parts;
  std::function<void(int, int)> rec = [&](int stage, int start) {
    if (stage == p.num_stages) {
      if (start != n) return;
      const Partition e = EvaluatePartition(p, parts);
      best.least_peak = std::min(best.least_peak, e.peak_bytes);
      if (e.peak_bytes <= p.capacity_bytes)
        best.bottleneck = std::min(best.bottleneck, e.bottleneck);
      return;
    }
    const int left_for_later = p.num_stages - stage - 1;
    for (int k = 1; start + k + left_for_later <= n; ++k) {
      parts.push_back(k);
      rec(stage + 1, start + k);
      parts.pop_back();
    }
  };
  rec(0, 0);
  return best;
}

PartitionProblem Random(std::mt19937& rng, bool uniform, bool memory) {
  std::uniform_int_distribution<int> blocks(1, 9);
  std::uniform_int_distribution<int> small(0, 6);  // small integers make ties common
  std::uniform_real_distribution<double> real(0.0, 5.0);
  PartitionProblem p;
  const int n = blocks(rng);
  p.num_stages = std::uniform_int_distribution<int>(1, n)(rng);
  const double c = small(rng) + 1;
  for (int j = 0; j < n; ++j) {
    p.block_cost.push_back(uniform ? c : (rng() % 2 ? small(rng) : real(rng)));
  }
  p.first_stage_cost = rng() % 3 == 0 ? 0.0 : real(rng);
  p.last_stage_cost = rng() % 3 == 0 ? 0.0 : small(rng) * 1.5;
  if (memory) {
    const double st = small(rng), act = small(rng) + 0.5;
    for (int j = 0; j < n; ++j) {
      p.block_static_bytes.push_back(uniform ? st : small(rng));
      p.block_activation_bytes.push_back(uniform ? act : real(rng));
    }
    for (int i = 0; i < p.num_stages; ++i) {
      p.stage_fixed_bytes.push_back(small(rng));
      p.stage_in_flight.push_back(p.num_stages - i);  // 1F1B
    }
    // Around the middle of the possible peaks, so that some cases do not fit at all.
    p.capacity_bytes = std::uniform_real_distribution<double>(5, 60)(rng);
  }
  return p;
}

void CheckAgainstBruteForce(const PartitionProblem& p, int case_index) {
  const Brute brute = BruteForce(p);
  absl::StatusOr<Partition> got = PartitionStages(p);
  if (brute.bottleneck == kInf) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << "case " << case_index;
  } else {
    ASSERT_TRUE(got.ok()) << "case " << case_index << ": " << got.status();
    EXPECT_NEAR(got->bottleneck, brute.bottleneck, 1e-9 * (1 + brute.bottleneck))
        << "case " << case_index;
    EXPECT_LE(got->peak_bytes, p.capacity_bytes) << "case " << case_index;
    int sum = 0;
    for (int k : got->blocks_per_stage) {
      EXPECT_GE(k, 1);
      sum += k;
    }
    EXPECT_EQ(sum, static_cast<int>(p.block_cost.size()));
    EXPECT_EQ(static_cast<int>(got->blocks_per_stage.size()), p.num_stages);
  }
  absl::StatusOr<Partition> least = MinimizePeakMemory(p);
  ASSERT_TRUE(least.ok());
  EXPECT_NEAR(least->peak_bytes, brute.least_peak, 1e-9 * (1 + brute.least_peak))
      << "case " << case_index;
}

TEST(StagePartitionerTest, HandCase) {
  // Costs 1,1,1,1 and a head of 2 on the last stage: [3 | 1] gives max(3, 1 + 2) = 3.
  PartitionProblem p;
  p.block_cost = {1, 1, 1, 1};
  p.last_stage_cost = 2;
  p.num_stages = 2;
  for (bool shortcut : {true, false}) {
    p.allow_uniform_shortcut = shortcut;
    absl::StatusOr<Partition> r = PartitionStages(p);
    ASSERT_TRUE(r.ok());
    EXPECT_DOUBLE_EQ(r->bottleneck, 3);
    EXPECT_EQ(r->blocks_per_stage, (std::vector<int>{3, 1}));
  }
}

TEST(StagePartitionerTest, MemoryLimitMovesBlocksLater) {
  // 1F1B: stage 0 holds 2 micro-batches of 1 byte per block, stage 1 holds one. Capacity 6
  // allows at most 3 blocks on stage 0; the time optimum alone would be [4 | 4].
  PartitionProblem p;
  p.block_cost.assign(8, 1.0);
  p.num_stages = 2;
  p.block_static_bytes.assign(8, 0.0);
  p.block_activation_bytes.assign(8, 1.0);
  p.stage_in_flight = {2, 1};
  p.capacity_bytes = 6;
  for (bool shortcut : {true, false}) {
    p.allow_uniform_shortcut = shortcut;
    absl::StatusOr<Partition> r = PartitionStages(p);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->blocks_per_stage, (std::vector<int>{3, 5}));
    EXPECT_DOUBLE_EQ(r->bottleneck, 5);
  }
  p.capacity_bytes = 3;  // stage 0 takes at most 1 block, stage 1 at most 3: 8 do not fit
  EXPECT_EQ(PartitionStages(p).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(StagePartitionerTest, RejectsBadShapes) {
  PartitionProblem p;
  p.block_cost = {1, 2};
  p.num_stages = 3;
  EXPECT_EQ(PartitionStages(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.num_stages = 0;
  EXPECT_EQ(PartitionStages(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.num_stages = 1;
  p.block_static_bytes = {1};
  p.block_activation_bytes = {1};
  EXPECT_EQ(PartitionStages(p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagePartitionerTest, MatchesBruteForceGeneral) {
  std::mt19937 rng(20240611);
  for (int c = 0; c < 3000; ++c) {
    PartitionProblem p = Random(rng, /*uniform=*/false, /*memory=*/c % 2 == 0);
    CheckAgainstBruteForce(p, c);
  }
}

TEST(StagePartitionerTest, MatchesBruteForceUniformBothPaths) {
  std::mt19937 rng(7);
  for (int c = 0; c < 3000; ++c) {
    PartitionProblem p = Random(rng, /*uniform=*/true, /*memory=*/c % 3 != 0);
    p.allow_uniform_shortcut = true;
    CheckAgainstBruteForce(p, c);
    p.allow_uniform_shortcut = false;
    CheckAgainstBruteForce(p, c);
  }
}

TEST(StagePartitionerTest, LargeUniformMatchesDynamicProgramme) {
  // 128 blocks into 64 stages with 1F1B memory, as for a 1T model: shortcut == DP.
  PartitionProblem p;
  p.block_cost.assign(128, 1.0);
  p.first_stage_cost = 0.1;
  p.last_stage_cost = 0.7;
  p.num_stages = 64;
  p.block_static_bytes.assign(128, 10.0);
  p.block_activation_bytes.assign(128, 1.0);
  for (int i = 0; i < 64; ++i) {
    p.stage_fixed_bytes.push_back(i == 63 ? 15.0 : 2.0);
    p.stage_in_flight.push_back(64 - i);
  }
  p.capacity_bytes = 100;
  absl::StatusOr<Partition> fast = PartitionStages(p);
  p.allow_uniform_shortcut = false;
  absl::StatusOr<Partition> dp = PartitionStages(p);
  ASSERT_TRUE(fast.ok());
  ASSERT_TRUE(dp.ok());
  EXPECT_NEAR(fast->bottleneck, dp->bottleneck, 1e-12);
  EXPECT_LE(fast->peak_bytes, 100);
}

}  // namespace
}  // namespace loom::planner
