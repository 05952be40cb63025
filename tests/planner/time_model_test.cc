// Time model pieces against hand-computed values on an idealised device: 1 PFLOP/s at 50% for
// every GEMM, NVLink 100 GB/s, network 50 GB/s per node, no latency or launch overhead, and
// memory-bound kernels made free, so each number below is a formula of the header.
#include "server/planner/time_model.h"

#include <gtest/gtest.h>

#include "server/planner/layout.h"
#include "server/planner/model_shape.h"

namespace loom::planner {
namespace {

DeviceSpec Ideal(int count, int per_node) {
  DeviceSpec d;
  d.model = "ideal";
  d.count = count;
  d.per_node = per_node;
  d.memory_bytes = 80 * kGiB;
  d.peak_flops = 1e15;
  d.memory_bandwidth_bytes_per_s = 1e30;
  d.intra_node_bytes_per_s = 100e9;
  d.inter_node_bytes_per_s = 50e9;
  EfficiencyTable& e = d.efficiency;
  e.gemm_small = e.gemm_medium = e.gemm_large = 0.5;
  e.allreduce_intra = e.allreduce_inter = e.p2p = 1.0;
  e.latency_intra_s = e.latency_inter_s = 0;
  e.block_overhead_s = 0;
  return d;
}

TEST(TimeModelTest, BubbleFraction) {
  EXPECT_DOUBLE_EQ(BubbleFraction(1, 16), 0.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(8, 8), 7.0 / 15.0);  // "pp=8 with 8 micro-batches: 47%"
  EXPECT_DOUBLE_EQ(BubbleFraction(4, 12), 0.2);
}

TEST(TimeModelTest, BlockComputeFromFlops) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  Layout l;
  l.micro_batch = 1;
  // b·s·(24h² + 2·s·h) = 1024 · (14,155,776 + 1,572,864) = 16,106,127,360 FLOPs at 5e14/s.
  const BlockTime t = BlockCost(m, Precision::kBf16, l, Ideal(1, 8));
  EXPECT_NEAR(t.forward, 16'106'127'360 / 5e14, 1e-15);
  EXPECT_NEAR(t.backward, 2 * 16'106'127'360 / 5e14, 1e-15);
  EXPECT_EQ(t.recompute, 0);
  EXPECT_EQ(t.tp_comm, 0);
  l.recompute = Recompute::kFull;
  EXPECT_NEAR(BlockCost(m, Precision::kBf16, l, Ideal(1, 8)).recompute, t.forward, 1e-15);
  l.recompute = Recompute::kSelective;  // attention core: 2·b·s²·h
  EXPECT_NEAR(BlockCost(m, Precision::kBf16, l, Ideal(1, 8)).recompute, 1'610'612'736 / 5e14,
              1e-15);
}

TEST(TimeModelTest, TensorAllReducesInsideAndAcrossNodes) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  Layout l;
  l.tp = 4;
  l.dp = 2;
  l.micro_batch = 1;
  // 4 all-reduces of b·s·h·2 bytes = 1,572,864, ring 2(t−1)/t over 100 GB/s NVLink.
  const double inside = BlockCost(m, Precision::kBf16, l, Ideal(8, 8)).tp_comm;
  EXPECT_NEAR(inside, 4 * 1.5 * 1'572'864 / 100e9, 1e-15);
  // Two GPUs per node: the group spans 2 nodes; its 2 ranks per node take the node's whole
  // 50 GB/s network, half the NVLink rate.
  const Link link = GroupLink(Ideal(8, 2), 4, 1);
  EXPECT_TRUE(link.spans_nodes);
  EXPECT_EQ(link.nodes, 2);
  EXPECT_DOUBLE_EQ(link.bytes_per_s, 50e9);
  EXPECT_NEAR(BlockCost(m, Precision::kBf16, l, Ideal(8, 2)).tp_comm, 2 * inside, 1e-15);
  // Full recompute replays the two forward all-reduces.
  l.recompute = Recompute::kFull;
  EXPECT_NEAR(BlockCost(m, Precision::kBf16, l, Ideal(8, 8)).tp_comm, 1.5 * inside, 1e-15);
}

TEST(TimeModelTest, DataParallelAllReduceBytesAndOverlap) {
  Layout l;
  l.dp = 8;
  // 1e9 parameters → 2e9 gradient bytes in bf16; each rank sends 2·7/8 of them.
  DataParallelTime t = DataParallelCost(Precision::kBf16, l, Ideal(8, 8), 1e9, 0.01);
  EXPECT_DOUBLE_EQ(t.gradient_bytes, 2e9);
  EXPECT_DOUBLE_EQ(t.wire_bytes, 3.5e9);
  EXPECT_NEAR(t.total, 0.035, 1e-12);
  EXPECT_NEAR(t.exposed, 0.025, 1e-12);  // 35 ms minus 10 ms of backward
  // A long backward hides all but the last 25 MiB bucket.
  t = DataParallelCost(Precision::kBf16, l, Ideal(8, 8), 1e9, 1.0);
  EXPECT_NEAR(t.exposed, 0.035 * 25 * 1024 * 1024 / 2e9, 1e-12);
  // ZeRO-1: the reduce-scatter half overlaps, the all-gather half does not.
  l.zero1 = true;
  t = DataParallelCost(Precision::kBf16, l, Ideal(8, 8), 1e9, 0.02);
  EXPECT_NEAR(t.exposed, 0.0175 + 0.035 * 25 * 1024 * 1024 / 2e9 / 2, 1e-12);
  // dp groups one rank per node (tp = 8 fills the node): each gets 1/8 of the network.
  l.zero1 = false;
  l.tp = 8;
  l.dp = 4;
  t = DataParallelCost(Precision::kBf16, l, Ideal(32, 8), 1e9, 0);
  EXPECT_NEAR(t.total, 1.5 * 2e9 / (50e9 / 8), 1e-12);
  l.dp = 1;
  EXPECT_EQ(DataParallelCost(Precision::kBf16, l, Ideal(8, 8), 1e9, 0).total, 0);
}

TEST(TimeModelTest, PipelineTransfer) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  Layout l;
  l.pp = 2;
  l.micro_batch = 1;
  EXPECT_NEAR(PipelineTransferSeconds(m, Precision::kBf16, l, Ideal(2, 8)), 1'572'864 / 100e9,
              1e-15);
  // 8 stages of 1 GPU on 1-GPU nodes: every hop crosses the 50 GB/s network.
  l.pp = 8;
  EXPECT_NEAR(PipelineTransferSeconds(m, Precision::kBf16, l, Ideal(8, 1)), 1'572'864 / 50e9,
              1e-15);
  l.pp = 1;
  EXPECT_EQ(PipelineTransferSeconds(m, Precision::kBf16, l, Ideal(1, 8)), 0);
}

TEST(TimeModelTest, StepPhasesAddUpAndBubbleIsTheFillAndDrain) {
  const ModelShape m = *ResolvePreset("gpt2-350m");
  Layout l;
  l.pp = 4;
  l.dp = 2;
  l.micro_batch = 2;
  l.num_micro_batches = 8;
  const StepTime t = EstimateStep(m, Precision::kBf16, l, Ideal(8, 8), {6, 6, 6, 6});
  EXPECT_NEAR(t.forward + t.backward + t.optimizer + t.comm_exposed + t.bubble, t.total,
              1e-12 * t.total);
  const double pipeline = t.forward + t.backward + t.tp_comm + t.pp_comm + t.bubble;
  EXPECT_NEAR(t.bubble / pipeline, 3.0 / 11.0, 1e-12);
  EXPECT_DOUBLE_EQ(t.bubble_fraction, 3.0 / 11.0);
  EXPECT_EQ(t.slowest_stage, 3);  // the head rides on the last stage
  EXPECT_GT(t.stage_imbalance, 1.0);

  l.pp = 1;
  l.dp = 8;
  const StepTime flat = EstimateStep(m, Precision::kBf16, l, Ideal(8, 8), {24});
  EXPECT_EQ(flat.bubble, 0);
  EXPECT_EQ(flat.pp_comm, 0);
}

}  // namespace
}  // namespace loom::planner
