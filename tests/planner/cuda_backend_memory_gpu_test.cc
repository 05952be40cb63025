// The planner's model of the GPU backend's memory (server/planner/cuda_backend_memory.h) against
// the real thing: the CUDA backend (GptCuda and its staging buffer) built and reserved on a
// device as loom-train builds it for one rank, its caching allocator's allocated and
// reserved bytes equal to the replay of the planner's request list, byte for byte, and the GEMM
// workspace outside it. Skipped without a CUDA device.
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/cuda_backend_memory.h"
#include "server/planner/model_shape.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/gpt_cuda.h"

namespace loom {
namespace {

// The planner mirrors the backend's staging buffer (checked where this builds, device or not).
static_assert(planner::kCudaHostScalars == int64_t{train::CudaBackend::kHostScalars});

void ExpectPlannerMatchesTheDevice(const char* preset, int B, int T) {
  SCOPED_TRACE(preset);
  const auto shape = planner::ResolvePreset(preset);
  ASSERT_TRUE(shape.ok()) << shape.status();
  planner::ModelShape m = *shape;
  m.seq_len = T;  // the planner sizes the position table by seq_len, as loom-train by --seq-len
  planner::Layout layout;
  layout.micro_batch = B;
  std::vector<int64_t> bytes;
  for (const planner::CudaBufferRequest& r : planner::CudaBackendRequests(m, layout)) {
    bytes.push_back(r.bytes);
  }
  const planner::CachingAllocatorState predicted = planner::SimulateCachingAllocator(bytes);

  train::ModelDims dims = *train::PresetDims(preset);
  dims.max_seq_len = T;
  train::CudaBackend backend(dims, train::ModelShard{1, 0, 0, dims.layers}, /*seed=*/1,
                             train::CudaBackendOptions{});
  backend.Reserve(B, T, /*slots=*/1);
  const train::GptCuda& model = backend.model();
  const train::AllocatorStats stats = model.memory_stats();
  EXPECT_EQ(static_cast<int64_t>(stats.allocated), predicted.allocated);
  EXPECT_EQ(static_cast<int64_t>(stats.reserved), predicted.reserved);
  EXPECT_EQ(static_cast<int64_t>(model.fixed_bytes()), planner::kCudaGemmWorkspaceBytes);
}

TEST(CudaBackendMemoryGpuTest, PlannerRequestsReplayToTheDevicesAllocatorBytes) {
  if (train::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectPlannerMatchesTheDevice("tiny", 2, 64);
  ExpectPlannerMatchesTheDevice("gpt2-124m", 16, 1024);
}

}  // namespace
}  // namespace loom
