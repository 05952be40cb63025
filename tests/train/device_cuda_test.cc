// The CUDA side of loom_train_device on a real GPU: the caching allocator over cudaMalloc,
// out-of-memory recovery, compute/communication stream ordering, and the event phase timer (which
// also opens NVTX ranges). Every test skips where no CUDA device is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "worker/train/device/caching_allocator.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/device/cuda_phase_timer.h"
#include "worker/train/device/cuda_stream.h"

namespace loom::train {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

// Reads `bytes` of device memory back to the host.
std::vector<uint8_t> Read(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

bool AllEqual(const std::vector<uint8_t>& v, uint8_t value) {
  for (uint8_t x : v) {
    if (x != value) return false;
  }
  return true;
}

TEST(DeviceCudaTest, AllocatorServesUsableMemoryAndReusesIt) {
  SKIP_WITHOUT_GPU();
  CudaMemory memory;
  CachingAllocator alloc(&memory);
  CudaStream stream;
  for (int step = 0; step < 3; ++step) {
    std::vector<void*> blocks;
    for (size_t bytes : {size_t{1000}, 300 * size_t{1024}, 5 * kMiB, 48 * kMiB}) {
      void* p = alloc.Allocate(bytes, stream.id());
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(cudaMemsetAsync(p, 0x5A, bytes, stream.get()), cudaSuccess);
      blocks.push_back(p);
    }
    stream.Synchronize();
    EXPECT_TRUE(AllEqual(Read(blocks[3], 48 * kMiB), 0x5A));
    for (void* p : blocks) alloc.Free(p);
  }
  const AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.num_device_allocs, 3u);  // one small, one 20 MiB and one 48 MiB segment
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.reserved, 2 * kMiB + 20 * kMiB + 48 * kMiB);
  EXPECT_LE(memory.events_created(), 8u);  // pooled: not one per free
  alloc.EmptyCache();
  EXPECT_EQ(alloc.GetStats().reserved, 0u);
}

TEST(DeviceCudaTest, OutOfMemoryThrowsAndLeavesTheDeviceUsable) {
  SKIP_WITHOUT_GPU();
  CudaMemory memory;
  CachingAllocator alloc(&memory);
  const DeviceMemoryInfo info = QueryDeviceMemory();
  ASSERT_GT(info.total_bytes, 0u);
  void* cached = alloc.Allocate(64 * kMiB);
  alloc.Free(cached);
  EXPECT_THROW(alloc.Allocate(info.total_bytes * 2), OutOfMemoryError);
  const AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.num_oom_retries, 1u);
  EXPECT_EQ(s.num_device_frees, 1u);  // the cached segment went back before the retry
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* p = alloc.Allocate(kMiB);
  ASSERT_EQ(cudaMemset(p, 1, kMiB), cudaSuccess);
  EXPECT_TRUE(AllEqual(Read(p, kMiB), 1));
  alloc.Free(p);
}

TEST(DeviceCudaTest, CommStreamWaitsForCompute) {
  SKIP_WITHOUT_GPU();
  ComputeCommStreams streams;
  const size_t bytes = 256 * kMiB;
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(src, 0, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0, bytes), cudaSuccess);
  for (int value = 1; value <= 3; ++value) {
    // Several writes on compute, then a copy on comm that must see the last of them.
    for (int k = 0; k < 4; ++k) {
      ASSERT_EQ(cudaMemsetAsync(src, value, bytes, streams.compute()), cudaSuccess);
    }
    streams.CommWaitsForCompute();
    ASSERT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, streams.comm()),
              cudaSuccess);
    streams.ComputeWaitsForComm();  // the next writes to src wait for the copy
  }
  streams.Synchronize();
  EXPECT_TRUE(AllEqual(Read(dst, bytes), 3));
  cudaFree(src);
  cudaFree(dst);
}

TEST(DeviceCudaTest, PhaseTimerMeasuresDeviceTimePerPhase) {
  SKIP_WITHOUT_GPU();
  CudaStream stream;
  const size_t bytes = 512 * kMiB;
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
  CudaPhaseTimer timer(stream.get());
  size_t events_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    timer.BeginStep();
    timer.Enter(Phase::kForward);
    ASSERT_EQ(cudaMemsetAsync(buf, 1, bytes, stream.get()), cudaSuccess);
    timer.Enter(Phase::kBackward);
    for (int k = 0; k < 4; ++k) {
      ASSERT_EQ(cudaMemsetAsync(buf, 2, bytes, stream.get()), cudaSuccess);
    }
    timer.Leave();
    ASSERT_EQ(cudaMemsetAsync(buf, 3, bytes, stream.get()), cudaSuccess);  // no phase
    timer.Enter(Phase::kOptimizer);
    ASSERT_EQ(cudaMemsetAsync(buf, 4, bytes, stream.get()), cudaSuccess);
    const PhaseSeconds s = timer.EndStep();
    EXPECT_GT(s[static_cast<int>(Phase::kForward)], 0.0);
    // Four times the work: clearly more time (memsets of 512 MiB take well over 50 us).
    EXPECT_GT(s[static_cast<int>(Phase::kBackward)], 2.0 * s[static_cast<int>(Phase::kForward)]);
    EXPECT_GT(s[static_cast<int>(Phase::kOptimizer)], 0.0);
    EXPECT_EQ(s[static_cast<int>(Phase::kData)], 0.0);
    if (step == 0) events_after_first = timer.events_created();
  }
  EXPECT_EQ(timer.events_created(), events_after_first);
  cudaFree(buf);
}

}  // namespace
}  // namespace loom::train
