// Data parallelism on the GPU (cuda_grad_sync.h: the CUDA backend with dp = 2 over NCCL): two ranks
// as two threads on two devices, meeting through a file store in a temp dir, give the one-GPU
// loss curve of the same global batch within bf16's tolerance, the same loss and gradient norm
// on both ranks, and a checkpoint written by dp rank 0 that both ranks resume. Skipped without
// two CUDA devices.
#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/gpu_rank.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/profiler/step_profiler.h"

namespace loom::train {
namespace {

using testing::GpuRank;
using testing::MakeGpuRank;
using testing::TempDir;
using testing::TinyConfig;

constexpr int kRanks = 2;

class CudaDpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int n = CudaDeviceCount();
    if (n < kRanks) GTEST_SKIP() << "needs " << kRanks << " CUDA devices (has " << n << ")";
  }
};

// tiny, global batch of 8 sequences of 32 tokens: one GPU runs K = 2 micro-batches of 4; each
// of 2 dp ranks runs K = 1 micro-batch of 4 (BatchSampler: the same 8 sequences).
JobConfig Config(int64_t steps) {
  JobConfig c = TinyConfig(steps);
  c.lr = 3e-3;
  c.global_batch_tokens = 2 * 4 * 32;
  return c;
}

BatchShape RankShape(const JobConfig& c, int rank) {
  BatchShape shape = ResolveBatchShape(c, RankEnv{});
  shape.K = 1;
  shape.dp_size = kRanks;
  shape.dp_rank = rank;
  return shape;
}

RendezvousConfig RankRendezvous(const TempDir& store, int rank, const std::string& job) {
  RendezvousConfig o;
  o.job = job;  // a fresh scope per gang: no stale NCCL unique id
  o.rank = rank;
  o.world_size = kRanks;
  o.store_dir = store.path();
  o.timeout = std::chrono::seconds(60);
  return o;
}

constexpr size_t kBucketBytes = 16 << 10;  // several buckets even for tiny: backward overlaps

std::unique_ptr<GpuRank> Rank(const JobConfig& c, const Dataset& data, const TempDir& store, int r,
                              const std::string& job) {
  return MakeGpuRank(c, RankShape(c, r), data, /*device=*/r, RankRendezvous(store, r, job),
                     kBucketBytes);
}

// Runs body(rank) on kRanks threads; rethrows the first exception.
template <typename Body>
void OnRanks(const Body& body) {
  std::vector<std::exception_ptr> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST_F(CudaDpTest, TwoGpusFollowTheOneGpuLossCurve) {
  constexpr int kSteps = 10;
  const JobConfig c = Config(kSteps);
  Dataset data = Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
  const BatchShape one = ResolveBatchShape(c, RankEnv{});
  ASSERT_EQ(one.K, 2);

  std::vector<float> single;
  {
    std::unique_ptr<GpuRank> gpu = MakeGpuRank(c, one, data, /*device=*/0);
    for (int s = 0; s < kSteps; ++s) single.push_back((*gpu)->Step().loss);
  }

  TempDir store;
  std::vector<std::vector<StepResult>> results(kRanks);
  OnRanks([&](int r) {
    std::unique_ptr<GpuRank> rank = Rank(c, data, store, r, "jobs/dp");
    Trainer* t = rank->trainer.get();
    EXPECT_GT(t->num_buckets(), 1u);
    for (int s = 0; s < kSteps; ++s) results[r].push_back(t->Step());
  });

  for (int s = 0; s < kSteps; ++s) {
    const StepResult& a = results[0][s];
    const StepResult& b = results[1][s];
    ASSERT_TRUE(std::isfinite(a.loss));
    // One all-reduce gives every rank the same loss and the same gradients.
    EXPECT_EQ(a.loss, b.loss) << "step " << s + 1;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s + 1;
    // bf16 sums in another order than the one GPU's accumulation: within a couple of percent.
    EXPECT_NEAR(a.loss, single[s], 0.02 * std::fabs(single[s])) << "step " << s + 1;
    EXPECT_GT(a.comm.dp_all_reduce, 0u);
    EXPECT_EQ(a.allreduce_bytes, a.comm.dp_all_reduce);
    EXPECT_GT(a.dp_comm_seconds, 0.0);
    EXPECT_GE(a.overlap_ratio, 0.0);
    EXPECT_LE(a.overlap_ratio, 1.0);
    EXPECT_GE(a.times.phase(Phase::kCommExposed), 0.0);
  }
  EXPECT_LT(results[0].back().loss, results[0].front().loss - 0.3f);
}

TEST_F(CudaDpTest, RankZeroWritesTheCheckpointAndBothRanksResumeIt) {
  constexpr int kSteps = 6;
  const JobConfig c = Config(kSteps);
  Dataset data = Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
  TempDir store, ck;

  // Straight through, and in two halves with a checkpoint between them.
  std::vector<std::vector<float>> straight(kRanks), halves(kRanks);
  std::vector<std::string> saved(kRanks);
  OnRanks([&](int r) {
    std::unique_ptr<GpuRank> rank = Rank(c, data, store, r, "jobs/straight");
    Trainer* t = rank->trainer.get();
    for (int s = 0; s < kSteps; ++s) straight[r].push_back(t->Step().loss);
  });
  OnRanks([&](int r) {
    std::unique_ptr<GpuRank> rank = Rank(c, data, store, r, "jobs/first");
    Trainer* t = rank->trainer.get();
    for (int s = 0; s < kSteps / 2; ++s) halves[r].push_back(t->Step().loss);
    saved[r] = t->Save(ck.path(), /*generation=*/1);
  });
  EXPECT_EQ(saved[0], saved[1]);
  EXPECT_TRUE(std::filesystem::exists(saved[0] + "/manifest.json")) << saved[0];
  OnRanks([&](int r) {
    std::unique_ptr<GpuRank> rank = Rank(c, data, store, r, "jobs/second");
    Trainer* t = rank->trainer.get();
    // How run.cc agrees on the resume point: every rank's step, summed over the world's NCCL.
    std::vector<float> steps(kRanks, 0.0f);
    steps[r] = kSteps / 2;
    t->backend().AllReduceHost(rank->groups.world.get(), steps.data(), steps.size());
    EXPECT_EQ(steps, std::vector<float>(kRanks, kSteps / 2));
    const CheckpointMeta meta = t->Resume(saved[0]);
    EXPECT_EQ(meta.step, kSteps / 2);
    EXPECT_EQ(meta.dp_size, kRanks);
    while (t->step() < kSteps) halves[r].push_back(t->Step().loss);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(halves[r].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(halves[r][s], straight[r][s], 1e-3 * std::fabs(straight[r][s]))
          << "rank " << r << " step " << s + 1;
    }
  }
}

}  // namespace
}  // namespace loom::train
