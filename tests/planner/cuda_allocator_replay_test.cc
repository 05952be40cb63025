// The GPU backend's memory model (cuda_backend_memory.h) against the worker's own code where it
// runs without a GPU:
//  - the allocator simulation against the real CachingAllocator (over device memory that hands
//    out addresses without backing them): the request lists of the planner's shapes, and random
//    sequences that exercise every pool, split and best-fit rule;
//  - the gradient buckets against PlanGradBuckets + ToPaddedLayout on the real parameter table;
//  - the scratch sizes and constants against kernels/cuda/launch.h (plain C++) and the
//    allocator's and buckets' constants.
// What is left unchecked here is the list of GptCuda's requests itself, which needs a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/launch.h"
#include "server/planner/cuda_backend_memory.h"
#include "server/planner/layout.h"
#include "server/planner/model_shape.h"
#include "worker/train/device/caching_allocator.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/padded_layout.h"
#include "worker/train/model/params.h"
#include "worker/train/parallel/grad_buckets.h"

namespace loom::planner {
namespace {

using train::CachingAllocator;

// Device memory without backing: distinct, never adjacent addresses; events always complete.
class UnbackedDeviceMemory : public train::DeviceMemory {
 public:
  void* Allocate(size_t bytes) override {
    const uintptr_t addr = next_;
    next_ += bytes + (uintptr_t{1} << 20);
    return reinterpret_cast<void*>(addr);
  }
  void Free(void*) override {}
  train::EventId RecordEvent(train::StreamId) override {
    return static_cast<train::EventId>(next_event_++);
  }
  bool EventDone(train::EventId) override { return true; }
  void ReleaseEvent(train::EventId) override {}

 private:
  uintptr_t next_ = uintptr_t{1} << 32;
  uintptr_t next_event_ = 1;
};

// Serves `requests` in order on the real allocator; the block each got is the growth of
// `allocated`.
struct Replayed {
  std::vector<int64_t> blocks;
  train::AllocatorStats stats;
};
Replayed Replay(const std::vector<int64_t>& requests) {
  UnbackedDeviceMemory memory;
  CachingAllocator allocator(&memory);
  Replayed r;
  for (int64_t bytes : requests) {
    const size_t before = allocator.GetStats().allocated;
    allocator.Allocate(static_cast<size_t>(bytes));
    r.blocks.push_back(static_cast<int64_t>(allocator.GetStats().allocated - before));
  }
  r.stats = allocator.GetStats();
  return r;
}

void ExpectSameAsTheAllocator(const std::vector<int64_t>& requests) {
  const CachingAllocatorState sim = SimulateCachingAllocator(requests);
  const Replayed real = Replay(requests);
  EXPECT_EQ(sim.block_bytes, real.blocks);
  EXPECT_EQ(sim.allocated, static_cast<int64_t>(real.stats.peak_allocated));
  EXPECT_EQ(sim.reserved, static_cast<int64_t>(real.stats.peak_reserved));
}

struct Shape {
  const char* preset;
  int micro_batch;
  int dp;
};

TEST(CudaAllocatorReplayTest, PlannerRequestsMatchTheRealAllocator) {
  const Shape shapes[] = {{"tiny", 1, 1},       {"tiny", 2, 1},       {"tiny", 8, 4},
                          {"small", 3, 2},      {"gpt2-124m", 1, 1},  {"gpt2-124m", 2, 2},
                          {"gpt2-124m", 16, 1}, {"gpt2-124m", 32, 8}, {"gpt2-124m", 64, 1},
                          {"gpt2-350m", 5, 3}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(std::string(s.preset) + " b=" + std::to_string(s.micro_batch) +
                 " dp=" + std::to_string(s.dp));
    Layout l;
    l.micro_batch = s.micro_batch;
    l.dp = s.dp;
    std::vector<int64_t> bytes;
    for (const CudaBufferRequest& q : CudaBackendRequests(*ResolvePreset(s.preset), l)) {
      bytes.push_back(q.bytes);
    }
    ExpectSameAsTheAllocator(bytes);
  }
}

TEST(CudaAllocatorReplayTest, RandomSequencesMatchTheRealAllocator) {
  std::mt19937_64 rng(20240611);
  // Sizes around every threshold: 512 B, 1 MiB (pool), 2 MiB (small segment), 20 MiB (large
  // segment), and a 1 MiB split remainder.
  const int64_t MiB = int64_t{1} << 20;
  const int64_t anchors[] = {1,       512,      MiB - 512, MiB,          MiB + 1,
                             2 * MiB, 19 * MiB, 20 * MiB,  20 * MiB + 1, 64 * MiB};
  for (int seq = 0; seq < 50; ++seq) {
    SCOPED_TRACE(seq);
    std::vector<int64_t> requests;
    for (int i = 0; i < 200; ++i) {
      const int64_t anchor = anchors[rng() % std::size(anchors)];
      const int64_t jitter = static_cast<int64_t>(rng() % (2 * MiB)) - MiB;
      requests.push_back(std::max<int64_t>(1, anchor + (rng() % 2 ? jitter : 0)));
    }
    ExpectSameAsTheAllocator(requests);
  }
}

TEST(CudaAllocatorReplayTest, ConstantsAreTheWorkersOwn) {
  EXPECT_EQ(kCudaAllocRoundBytes, int64_t(CachingAllocator::kRoundBytes));
  EXPECT_EQ(kCudaSmallRequestLimit, int64_t(CachingAllocator::kSmallRequestLimit));
  EXPECT_EQ(kCudaSmallSegmentBytes, int64_t(CachingAllocator::kSmallSegmentBytes));
  EXPECT_EQ(kCudaLargeSegmentBytes, int64_t(CachingAllocator::kLargeSegmentBytes));
  EXPECT_EQ(kCudaDpBucketBytes, int64_t(train::kDefaultBucketBytes));
  namespace launch = kernels::cuda::launch;
  EXPECT_EQ(kCudaGemmWorkspaceBytes, int64_t(launch::kMatmulWorkspaceBytes));
  EXPECT_EQ(kCudaGradNormBlocks, int64_t(launch::kGradNormBlocks));
  EXPECT_EQ(kCudaColumnSumRows, int64_t(launch::kColumnSumRows));
  EXPECT_EQ(kCudaFlashMaxHeadSize, int64_t(launch::kFlashMaxHeadSize));
  // GptCuda's choice of attention kernels and the planner's agree on every head shape.
  for (int64_t nh = 1; nh <= 32; ++nh) {
    for (int64_t hs = 1; hs <= 160; ++hs) {
      EXPECT_EQ(CudaFlashAttention(nh * hs, nh), launch::FlashAttentionSupported(nh * hs, nh))
          << "NH " << nh << " HS " << hs;
    }
  }
  EXPECT_FALSE(CudaFlashAttention(100, 3));  // C not divisible by NH
}

// The scratch requests, the padded parameter count and the buckets, from the worker's own
// functions (GptCuda::Reserve calls the launch.h ones; CudaGradSync the bucket ones).
TEST(CudaAllocatorReplayTest, ScratchAndBucketsAreTheWorkersOwn) {
  for (const char* preset : {"tiny", "small", "gpt2-124m", "gpt2-350m"}) {
    for (int b : {1, 3, 16}) {
      SCOPED_TRACE(std::string(preset) + " b=" + std::to_string(b));
      const ModelShape m = *ResolvePreset(preset);
      const train::ModelDims dims = *train::PresetDims(preset);
      Layout l;
      l.micro_batch = b;
      l.dp = 2;
      const long N = long{b} * m.seq_len;
      const std::vector<train::TensorInfo> table = train::ParamTable(dims);
      const train::PaddedLayout padded =
          train::MakePaddedLayout(table, static_cast<int>(kCudaVocabMultiple));
      std::map<std::string, int64_t> by_name;
      std::vector<int64_t> buckets;
      for (const CudaBufferRequest& q : CudaBackendRequests(m, l)) {
        by_name[q.name] = q.bytes;
        if (q.name.rfind("bucket ", 0) == 0) buckets.push_back(q.bytes);
      }
      namespace launch = kernels::cuda::launch;
      EXPECT_EQ(by_name["layernorm scratch"],
                int64_t(launch::LayerNormBackwardScratchFloats(N, m.hidden) * sizeof(float)));
      // Every preset has heads of 16 or 64 channels: the fused kernels' scratch and, per
      // block, the fp32 log-sum-exp instead of the (B, NH, T, T) probabilities.
      ASSERT_TRUE(launch::FlashAttentionSupported(m.hidden, m.heads));
      EXPECT_EQ(by_name["attention scratch"],
                int64_t(launch::FlashAttentionScratchBytes(b, m.seq_len, m.heads)));
      EXPECT_EQ(by_name.count("att"), 0u);
      EXPECT_EQ(by_name["att lse"], int64_t{m.layers} * b * m.heads * m.seq_len * 4);
      EXPECT_EQ(by_name["params"], int64_t(padded.total * 2));
      EXPECT_EQ(by_name["master"], int64_t(train::ParamCount(table) * 4));  // no padding rows
      EXPECT_EQ(by_name["logits"], int64_t{N} * padded.padded_vocab * 2);
      const std::vector<train::GradBucketPlan> plan = train::ToPaddedLayout(
          train::PlanGradBuckets(table, dims.layers, train::kDefaultBucketBytes, 2), table, padded);
      std::vector<int64_t> want;
      for (const train::GradBucketPlan& p : plan) want.push_back(int64_t(p.numel * 2));
      EXPECT_EQ(buckets, want);
    }
  }
}

}  // namespace
}  // namespace loom::planner
