// The training loop: determinism, resume bit-for-bit, layout invariance, the learning-rate
// schedule and clipping; the progress line of a step.
#include "worker/train/trainer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/parallel/zero_optimizer.h"
#include "worker/train/progress.h"

namespace loom::train {
namespace {

using testing::TempDir;
using testing::TinyConfig;

Dataset TinyData(const JobConfig& c) {
  return Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
}

bool SameParams(const Trainer& a, const Trainer& b) {
  return a.model().num_params() == b.model().num_params() &&
         std::memcmp(a.model().params(), b.model().params(),
                     a.model().num_params() * sizeof(float)) == 0;
}

TEST(TrainerTest, SameSeedSameBitsAndLossFalls) {
  JobConfig c = TinyConfig(12);
  c.lr = 3e-3;
  Dataset data = TinyData(c);
  BatchShape shape = ResolveBatchShape(c, RankEnv{});
  Trainer a(c, shape, data), b(c, shape, data);
  std::vector<float> la, lb;
  for (int i = 0; i < 12; ++i) {
    StepResult r = a.Step();
    la.push_back(r.loss);
    lb.push_back(b.Step().loss);
    EXPECT_EQ(r.step, i + 1);
    EXPECT_GT(r.times.phase(Phase::kForward), 0.0);
    EXPECT_GT(r.times.phase(Phase::kBackward), 0.0);
    EXPECT_GT(r.times.tokens_per_second, 0.0);
    EXPECT_GE(r.peak_memory_bytes, r.memory_bytes);
    // Parameters, gradients and both moments are at least 4 copies of the parameters.
    EXPECT_GT(r.memory_bytes, 4 * a.model().num_params() * sizeof(float));
    EXPECT_GT(r.rss_bytes, 0u);
    // No caching allocator on the CPU: reserved is allocated, nothing fragmented or allocated
    // on a device.
    EXPECT_EQ(r.reserved_memory_bytes, r.memory_bytes);
    EXPECT_EQ(r.memory_fragmentation, 0.0);
    EXPECT_EQ(r.device_allocations, 0u);
    EXPECT_EQ(r.device, "cpu");
  }
  EXPECT_EQ(la, lb);
  EXPECT_TRUE(SameParams(a, b));
  EXPECT_LT(la.back(), la.front() - 0.5f);  // from ~5.5 (ln 256) down
}

// The progress line carries the profiler's memory statistics (docs/rank-contract.md): from the
// CPU trainer's own step, and as a GPU rank's StepResult would hold them.
TEST(ProgressTest, StepLineCarriesTheMemoryStatistics) {
  JobConfig c = TinyConfig(1);
  Dataset data = TinyData(c);
  Trainer trainer(c, ResolveBatchShape(c, RankEnv{}), data);
  const StepResult cpu = trainer.Step();
  Progress progress(/*rank=*/0, /*total_steps=*/1, /*progress_fd=*/-1, /*human=*/false);
  const std::string line = progress.StepJson(cpu);
  const std::string allocated = std::to_string(cpu.memory_bytes);
  EXPECT_NE(line.find("\"memory_bytes\":" + allocated + ","), std::string::npos) << line;
  EXPECT_NE(line.find("\"rss_bytes\":" + std::to_string(cpu.rss_bytes) + ","), std::string::npos)
      << line;
  EXPECT_NE(line.find("\"reserved_memory_bytes\":" + allocated + ","), std::string::npos) << line;
  EXPECT_NE(line.find("\"memory_fragmentation\":0,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"device_allocations\":0,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"device\":\"cpu\"}"), std::string::npos) << line;

  StepResult gpu;
  gpu.step = 3;
  gpu.memory_bytes = 3 << 20;
  gpu.peak_memory_bytes = 5 << 20;
  gpu.reserved_memory_bytes = 22 << 20;
  gpu.memory_fragmentation = 0.25;
  gpu.device_allocations = 2;
  gpu.device = "cuda:1";
  const std::string gpu_line = progress.StepJson(gpu);
  for (const char* field : {"\"memory_bytes\":3145728,", "\"peak_memory_bytes\":5242880,",
                            "\"reserved_memory_bytes\":23068672,", "\"memory_fragmentation\":0.25,",
                            "\"device_allocations\":2,", "\"device\":\"cuda:1\"}"}) {
    EXPECT_NE(gpu_line.find(field), std::string::npos) << field << " in " << gpu_line;
  }
}

// Per-block costs (issue 12, part 1): every kBlockSampleEvery-th step of a single-stage trainer
// times the embedding, every block and the head, and the progress line carries them; the other
// steps carry none, and sampling off carries none at all.
TEST(TrainerTest, SampledStepsCarryPerBlockCosts) {
  JobConfig c = TinyConfig(kBlockSampleEvery);
  Dataset data = TinyData(c);
  Trainer trainer(c, ResolveBatchShape(c, RankEnv{}), data);
  Progress progress(/*rank=*/0, c.steps, /*progress_fd=*/-1, /*human=*/false);
  for (int64_t i = 1; i <= kBlockSampleEvery; ++i) {
    const StepResult r = trainer.Step();
    const std::string line = progress.StepJson(r);
    if (i % kBlockSampleEvery != 0) {
      EXPECT_FALSE(r.has_block_costs) << "step " << i;
      EXPECT_EQ(line.find("block_seconds"), std::string::npos) << line;
      continue;
    }
    ASSERT_TRUE(r.has_block_costs) << "step " << i;
    const BlockCosts& b = r.block_costs;
    EXPECT_EQ(b.first_block, 0);
    ASSERT_EQ(b.forward.size(), static_cast<size_t>(c.model.layers));
    ASSERT_EQ(b.backward.size(), b.forward.size());
    double blocks = 0;
    for (size_t j = 0; j < b.forward.size(); ++j) {
      EXPECT_GT(b.forward[j], 0.0);
      EXPECT_GT(b.backward[j], 0.0);
      blocks += b.forward[j] + b.backward[j];
    }
    EXPECT_TRUE(b.has_embedding);
    EXPECT_TRUE(b.has_head);
    EXPECT_GT(b.embedding_forward, 0.0);
    EXPECT_GT(b.head_forward, 0.0);
    EXPECT_GT(b.head_backward, 0.0);
    // The parts are inside the step's forward + backward phases.
    const double fwd_bwd = r.times.phase(Phase::kForward) + r.times.phase(Phase::kBackward);
    EXPECT_LE(
        blocks + b.embedding_forward + b.embedding_backward + b.head_forward + b.head_backward,
        fwd_bwd * 1.001);
    EXPECT_NE(line.find("\"block_seconds\":{\"first_block\":0,\"forward\":["), std::string::npos)
        << line;
    EXPECT_NE(line.find("\"embedding\":["), std::string::npos) << line;
    EXPECT_NE(line.find("\"head\":["), std::string::npos) << line;
  }
  Trainer every(c, ResolveBatchShape(c, RankEnv{}), data);
  every.set_block_sample_every(1);
  EXPECT_TRUE(every.Step().has_block_costs);
  every.set_block_sample_every(0);  // off
  EXPECT_FALSE(every.Step().has_block_costs);
}

// N steps uninterrupted == k steps + save + load into a fresh trainer + N - k steps.
TEST(TrainerTest, ResumeIsBitForBit) {
  TempDir dir;
  JobConfig c = TinyConfig(10);
  c.lr = 2e-3;
  c.warmup_steps = 3;
  c.micro_batch = 2;  // K = 2: gradient accumulation on the way
  Dataset data = TinyData(c);
  BatchShape shape = ResolveBatchShape(c, RankEnv{});
  ASSERT_EQ(shape.K, 2);
  Trainer straight(c, shape, data);
  std::vector<float> losses;
  for (int i = 0; i < 10; ++i) losses.push_back(straight.Step().loss);

  Trainer first(c, shape, data);
  for (int i = 0; i < 4; ++i) first.Step();
  std::string saved = first.Save(dir.path(), 1);
  Trainer resumed(c, shape, data);
  ASSERT_FALSE(SameParams(first, resumed));
  resumed.Resume(saved);
  EXPECT_EQ(resumed.step(), 4);
  EXPECT_TRUE(SameParams(first, resumed));
  for (int i = 4; i < 10; ++i) EXPECT_EQ(resumed.Step().loss, losses[i]) << "step " << i + 1;
  EXPECT_TRUE(SameParams(straight, resumed));
}

// The same global batch split as (B=4, K=1) or (B=2, K=2) gives the same loss curve to fp32
// rounding (the invariance principle of DESIGN.md).
TEST(TrainerTest, MicroBatchLayoutsAgree) {
  JobConfig c = TinyConfig(8);
  c.lr = 2e-3;
  Dataset data = TinyData(c);
  BatchShape one = ResolveBatchShape(c, RankEnv{});
  c.micro_batch = 2;
  BatchShape two = ResolveBatchShape(c, RankEnv{});
  ASSERT_EQ(one.K, 1);
  ASSERT_EQ(two.K, 2);
  Trainer a(c, one, data), b(c, two, data);
  for (int i = 0; i < 8; ++i) {
    float la = a.Step().loss, lb = b.Step().loss;
    EXPECT_NEAR(la, lb, 1e-5 * la) << "step " << i + 1;
  }
}

TEST(ScheduleTest, WarmupThenCosineToTheFloor) {
  LrSchedule s{1e-3, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(s, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(s, 10), 1e-3);
  EXPECT_NEAR(LearningRate(s, 10 + 99 / 2.0), 0.55e-3, 1e-5);
  EXPECT_DOUBLE_EQ(LearningRate(s, 109), 1e-4);
  for (int64_t step = 11; step < 110; ++step) {
    EXPECT_LT(LearningRate(s, step), LearningRate(s, step - 1));
  }
}

TEST(ClipTest, ScalesToTheMaximumNorm) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_FLOAT_EQ(ClipGradients(g.data(), 2, 5.0, 1.0), 0.2f);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.8f);
  EXPECT_FLOAT_EQ(ClipGradients(g.data(), 2, 1.0, 2.0), 1.0f);
  EXPECT_FLOAT_EQ(ClipGradients(g.data(), 2, 1.0, 0.0), 1.0f);  // 0 disables
  std::vector<TensorInfo> table = {{"a", {2}, 0, 2, true}};
  std::vector<float> h = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(GradNorm(h.data(), table), 5.0);
}

// ZeRO-1's ranges cover the buffer once, and AdamW over ranges updates exactly as AdamW over
// the whole buffer (the update is elementwise; a range may cut a tensor).
TEST(ZeroTest, RangesCoverTheBufferAndRangedUpdatesMatchTheWhole) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{10}, size_t{1001}}) {
    for (int size : {1, 2, 3, 4}) {
      size_t next = 0;
      for (int r = 0; r < size; ++r) {
        ZeroRange z = ZeroRangeOf(n, size, r);
        EXPECT_EQ(z.begin, next) << "n=" << n << " size=" << size << " rank " << r;
        EXPECT_LE(z.end - z.begin, z.shard);
        next = z.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  JobConfig c = TinyConfig(1);
  std::vector<TensorInfo> table = ParamTable(c.model);
  const size_t n = ParamCount(table);
  std::vector<float> whole(n), ranged(n), grads(n);
  InitParams(whole.data(), table, c.model.layers, 3);
  ranged = whole;
  for (size_t i = 0; i < n; ++i) grads[i] = 0.01f * static_cast<float>((i * 7919) % 13) - 0.06f;
  AdamW full(n, AdamWConfig{});
  std::vector<AdamW> parts;
  for (int r = 0; r < 3; ++r) {
    ZeroRange z = ZeroRangeOf(n, 3, r);
    parts.emplace_back(n, AdamWConfig{}, z.begin, z.end);
  }
  for (int step = 0; step < 3; ++step) {
    full.Update(whole.data(), grads.data(), table, 1e-3f);
    for (AdamW& p : parts) p.Update(ranged.data(), grads.data(), table, 1e-3f);
  }
  EXPECT_EQ(0, std::memcmp(whole.data(), ranged.data(), n * sizeof(float)));
  // Each rank keeps the moments of its third only.
  EXPECT_LE(parts[0].bytes_allocated(), 2 * ZeroRangeOf(n, 3, 0).shard * sizeof(float));
  EXPECT_LT(parts[0].bytes_allocated(), full.bytes_allocated() / 2);
}

}  // namespace
}  // namespace loom::train
