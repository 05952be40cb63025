// Memory model components against hand-computed values (derivations in the comments).
#include "server/planner/memory_model.h"

#include <gtest/gtest.h>

#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/model_shape.h"

namespace loom::planner {
namespace {

DeviceSpec H100(int count) { return *DefaultDevice("H100-SXM", count, 8); }

// gpt2-124m (L=12, h=768, a=12, s=1024, V=50257) on one GPU, bf16, b=1, no recompute.
TEST(MemoryModelTest, Gpt2SmallOnOneDevice) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  Layout l;  // dp = tp = pp = 1
  l.micro_batch = 1;
  l.num_micro_batches = 8;
  const MemoryBreakdown mem = StageMemory(m, Precision::kBf16, l, H100(1), 0, 12);
  // P = 124,439,808: 2 B weights, 2 B grads, 12 B fp32 master + Adam m, v.
  EXPECT_DOUBLE_EQ(mem.weights, 248'879'616);
  EXPECT_DOUBLE_EQ(mem.gradients, 248'879'616);
  EXPECT_DOUBLE_EQ(mem.optimizer, 1'493'277'696);
  // Per block: s·b·h·(34 + 5·a·s/h) = 786,432 · (34 + 80) = 89,653,248; 12 blocks, 1 in flight.
  EXPECT_DOUBLE_EQ(BlockActivationBytes(m, Precision::kBf16, l), 89'653'248);
  EXPECT_DOUBLE_EQ(mem.activations, 1'075'838'976);
  // Token ids 4·s (4,096); targets 4·s (4,096) + final LN 2·2·s·h (3,145,728) + bf16 logits
  // 2·s·V (102,926,336); fp32 softmax 4·s·V (205,852,672).
  EXPECT_DOUBLE_EQ(mem.embedding_and_logits, 311'932'928);
  EXPECT_DOUBLE_EQ(mem.comm_buffers, 0);  // dp = pp = 1
  EXPECT_DOUBLE_EQ(mem.workspace, 89'653'248);
  EXPECT_DOUBLE_EQ(mem.allocated(), 3'468'462'080);
  EXPECT_DOUBLE_EQ(mem.fragmentation, 346'846'208);
  EXPECT_DOUBLE_EQ(mem.runtime_reserve, kGiB);
  EXPECT_DOUBLE_EQ(mem.total(), 3'468'462'080 * 1.1 + kGiB);
}

// gpt-7b (L=32, h=4096, a=32, s=2048, V=50257), tp=2, pp=2, dp=2, ZeRO-1, b=1, m=8, 1F1B,
// 16 blocks per stage.
TEST(MemoryModelTest, SevenBillionTp2Pp2Zero1) {
  const ModelShape m = *ResolvePreset("gpt-7b");
  Layout l;
  l.dp = 2;
  l.tp = 2;
  l.pp = 2;
  l.micro_batch = 1;
  l.num_micro_batches = 8;
  l.zero1 = true;
  const DeviceSpec d = H100(8);
  // Block per tp rank: 12h²/2 + 7h/2 + 6h = 100,702,208. Stage 0 adds the vocab-parallel token
  // table V·h/2 (102,926,336) and the position table s·h (8,388,608): 1,722,550,272 params.
  const MemoryBreakdown s0 = StageMemory(m, Precision::kBf16, l, d, 0, 16);
  EXPECT_DOUBLE_EQ(s0.weights, 2.0 * 1'722'550'272);
  EXPECT_DOUBLE_EQ(s0.gradients, 2.0 * 1'722'550'272);
  EXPECT_DOUBLE_EQ(s0.optimizer, 6.0 * 1'722'550'272);  // 12 B / dp
  // s·b·h·(10 + 24/t + 5·a·s/(h·t)) = 8,388,608 · (10 + 12 + 40) = 520,093,696 per block;
  // stage 0 holds pp − 0 = 2 micro-batches: 16 · 2 · 520,093,696.
  EXPECT_DOUBLE_EQ(s0.activations, 16'642'998'272);
  EXPECT_DOUBLE_EQ(s0.embedding_and_logits, 16'384);  // token ids, 2 micro-batches
  // Two 25 MiB dp buckets + receive buffers for activation and gradient, 2·(2·s·h).
  EXPECT_DOUBLE_EQ(s0.comm_buffers, 52'428'800 + 33'554'432);
  EXPECT_DOUBLE_EQ(s0.workspace, 520'093'696);
  EXPECT_DOUBLE_EQ(s0.allocated(), 34'474'594'304);

  // Last stage: final LN 2h and its own copy of the tied table V·h/2: 1,714,169,856 params;
  // one micro-batch in flight; targets, LN input/output (33,554,432), bf16 logits s·V/2
  // (102,926,336 bytes) and the fp32 softmax (205,852,672).
  const MemoryBreakdown s1 = StageMemory(m, Precision::kBf16, l, d, 1, 16);
  EXPECT_DOUBLE_EQ(s1.weights + s1.gradients + s1.optimizer, 10.0 * 1'714'169'856);
  EXPECT_DOUBLE_EQ(s1.activations, 8'321'499'136);
  EXPECT_DOUBLE_EQ(s1.embedding_and_logits, 342'341'632);
  EXPECT_DOUBLE_EQ(s1.allocated(), 26'411'616'256);
}

TEST(MemoryModelTest, RecomputeVariants) {
  const ModelShape m = *ResolvePreset("gpt-7b");
  Layout l;
  l.tp = 4;
  l.micro_batch = 2;
  const double sbh = 2048.0 * 2 * 4096;
  l.recompute = Recompute::kNone;
  EXPECT_DOUBLE_EQ(BlockActivationBytes(m, Precision::kBf16, l),
                   sbh * (10 + 24.0 / 4 + 5.0 * 32 * 2048 / (4096.0 * 4)));
  l.recompute = Recompute::kSelective;  // the attention-core term is gone
  EXPECT_DOUBLE_EQ(BlockActivationBytes(m, Precision::kBf16, l), sbh * 16);
  l.recompute = Recompute::kFull;  // only the block input, not split by tp
  EXPECT_DOUBLE_EQ(BlockActivationBytes(m, Precision::kBf16, l), 2 * sbh);
  EXPECT_DOUBLE_EQ(BlockActivationBytes(m, Precision::kFp32, l), 4 * sbh);
}

TEST(MemoryModelTest, ParamBytesByPrecisionAndZero) {
  Layout l;
  l.dp = 4;
  EXPECT_DOUBLE_EQ(ParamBytes(Precision::kBf16, l).total(), 16);
  EXPECT_DOUBLE_EQ(ParamBytes(Precision::kFp32, l).total(), 16);
  l.zero1 = true;
  EXPECT_DOUBLE_EQ(ParamBytes(Precision::kBf16, l).optimizer, 3);
  EXPECT_DOUBLE_EQ(ParamBytes(Precision::kBf16, l).total(), 7);
  EXPECT_DOUBLE_EQ(ParamBytes(Precision::kFp32, l).total(), 10);
}

TEST(MemoryModelTest, MicroBatchesInFlight) {
  Layout l;
  l.pp = 4;
  l.num_micro_batches = 8;
  EXPECT_EQ(MicroBatchesInFlight(l, 0), 4);  // 1F1B: the first stage holds pp
  EXPECT_EQ(MicroBatchesInFlight(l, 3), 1);
  l.num_micro_batches = 2;
  EXPECT_EQ(MicroBatchesInFlight(l, 0), 2);  // never more than m
  l.schedule = Schedule::kGPipe;
  l.num_micro_batches = 8;
  EXPECT_EQ(MicroBatchesInFlight(l, 0), 8);
  EXPECT_EQ(MicroBatchesInFlight(l, 3), 8);
}

TEST(MemoryModelTest, GPipeHoldsEveryMicroBatch) {
  const ModelShape m = *ResolvePreset("gpt2-350m");
  Layout l;
  l.pp = 4;
  l.dp = 2;
  l.micro_batch = 2;
  l.num_micro_batches = 16;
  const double per_block = BlockActivationBytes(m, Precision::kBf16, l);
  const MemoryBreakdown one_f_one_b = StageMemory(m, Precision::kBf16, l, H100(8), 0, 6);
  l.schedule = Schedule::kGPipe;
  const MemoryBreakdown gpipe = StageMemory(m, Precision::kBf16, l, H100(8), 0, 6);
  EXPECT_DOUBLE_EQ(one_f_one_b.activations, 6 * 4 * per_block);
  EXPECT_DOUBLE_EQ(gpipe.activations, 6 * 16 * per_block);
  EXPECT_DOUBLE_EQ(gpipe.weights, one_f_one_b.weights);
}

TEST(MemoryModelTest, CpuHasNoRuntimeReserve) {
  const DeviceSpec cpu = *DefaultDevice("cpu", 4, 4);
  EXPECT_DOUBLE_EQ(RuntimeReserveBytes(cpu), 0);
  EXPECT_DOUBLE_EQ(AllocatableBytes(cpu), 16 * kGiB / 1.1);
  EXPECT_DOUBLE_EQ(AllocatableBytes(H100(8)), 79 * kGiB / 1.1);
}

}  // namespace
}  // namespace loom::planner
