// The doctor's MEMORY finding from a real allocator's figures (issue 12: "a fragmenting allocator
// (the caching allocator over its fake device) gets MEMORY"): the GPU path's CachingAllocator,
// over device memory that hands out addresses without backing them, serves a training step's
// activations; each step's AllocatorStats become the step report a GPU rank sends (allocated,
// reserved, fragmentation, device allocations in the step), and the doctor's rules judge the
// window. A job whose micro-batch shape changes every step fragments the cache and gets MEMORY
// naming its rank; the same job with a fixed shape reaches a steady state and gets none.
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "server/doctor/rules.h"
#include "server/doctor/telemetry_window.h"
#include "worker/train/device/caching_allocator.h"

namespace loom {
namespace {

using train::AllocatorStats;
using train::CachingAllocator;
using train::DeviceMemory;
using train::EventId;
using train::StreamId;

constexpr size_t kMiB = size_t{1} << 20;

// Unbacked addresses with gaps between segments (so the allocator can never merge two), and
// streams that are always idle (events complete at once).
class UnbackedDeviceMemory : public DeviceMemory {
 public:
  void* Allocate(size_t bytes) override {
    const uintptr_t addr = next_;
    next_ += bytes + kMiB;
    return reinterpret_cast<void*>(addr);
  }
  void Free(void*) override {}
  EventId RecordEvent(StreamId) override { return static_cast<EventId>(++events_); }
  bool EventDone(EventId) override { return true; }
  void ReleaseEvent(EventId) override {}

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
  uint64_t events_ = 0;
};

// One step of a test-role GPU rank that lays out its buffers as GptCuda::Reserve does: the
// activations of 8 blocks and the logits (sized by the step's tokens) stay allocated from step
// to step and are freed and allocated again only when the shape changes. Returns the step report
// the rank would send.
struct Activations {
  size_t tokens = 0;
  std::vector<void*> buffers;
};

v1::StepReport Step(CachingAllocator& alloc, Activations& acts, int64_t step, size_t tokens,
                    uint64_t* segments) {
  if (tokens != acts.tokens) {
    for (void* p : acts.buffers) alloc.Free(p);
    acts.buffers.clear();
    for (int block = 0; block < 8; ++block) acts.buffers.push_back(alloc.Allocate(tokens * 4096));
    acts.buffers.push_back(alloc.Allocate(tokens * 16384));  // logits
    acts.tokens = tokens;
  }
  // The step's transient scratch: taken and given back within the step.
  alloc.Free(alloc.Allocate(tokens * 1024));
  const AllocatorStats s = alloc.GetStats();
  v1::StepReport r;
  r.set_rank(0);
  r.set_step(step);
  (*r.mutable_phase_seconds())["forward"] = 0.1;
  (*r.mutable_phase_seconds())["backward"] = 0.2;
  (*r.mutable_phase_seconds())["optimizer"] = 0.01;
  r.set_step_seconds(0.31);
  r.set_memory_bytes(s.allocated);
  r.set_peak_memory_bytes(s.peak_allocated);
  r.set_reserved_memory_bytes(s.reserved);
  r.set_memory_fragmentation(s.fragmentation);
  r.set_device_allocations(s.num_device_allocs - *segments);
  *segments = s.num_device_allocs;
  return r;
}

std::optional<v1::Finding> MemoryFinding(const std::vector<size_t>& tokens_per_step,
                                         uint64_t device_memory_bytes = 0) {
  UnbackedDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* params = alloc.Allocate(64 * kMiB);
  doctor::TelemetryWindow window;
  Activations acts;
  uint64_t segments = 0;
  for (size_t i = 0; i < tokens_per_step.size(); ++i) {
    window.Add(Step(alloc, acts, static_cast<int64_t>(i + 1), tokens_per_step[i], &segments));
  }
  for (void* p : acts.buffers) alloc.Free(p);
  alloc.Free(params);
  doctor::DoctorInput in;
  in.window = &window;
  in.rank_nodes[0] = "node-a";
  in.device_memory_bytes = device_memory_bytes;
  for (const v1::Finding& f : doctor::Diagnose(in).findings) {
    if (f.kind() == v1::MEMORY) return f;
  }
  return std::nullopt;
}

TEST(DoctorAllocatorTest, AShapeThatChangesEveryStepFragmentsTheCacheAndIsNamed) {
  // Tokens per micro-batch growing and shrinking from step to step (a sequence length picked
  // per step): blocks cached at one size are split for the next and the rest stays in pieces.
  std::vector<size_t> tokens;
  for (int step = 0; step < 24; ++step) tokens.push_back(1024 + 512 * ((step * 7) % 11));
  const std::optional<v1::Finding> f = MemoryFinding(tokens);
  ASSERT_TRUE(f.has_value()) << "no MEMORY finding";
  EXPECT_EQ(f->rank(), 0);
  EXPECT_EQ(f->node(), "node-a");
  EXPECT_NE(f->fix().find("keep the step's shapes fixed"), std::string::npos) << f->fix();
  std::map<std::string, double> evidence;
  for (const auto& e : f->evidence()) evidence[e.name()] = e.value();
  EXPECT_GT(evidence["memory_fragmentation"], 0.3) << f->summary();  // the raise threshold
  EXPECT_GE(evidence["reserved_minus_allocated_bytes"], 32.0 * kMiB) << f->summary();
  std::printf("finding: %s\n", f->summary().c_str());
}

TEST(DoctorAllocatorTest, AFixedShapeReachesASteadyStateAndRaisesNothing) {
  // 32 MiB activations: each fills a segment of its own.
  const std::optional<v1::Finding> f = MemoryFinding(std::vector<size_t>(24, 8192));
  EXPECT_FALSE(f.has_value()) << f->summary();
}

TEST(DoctorAllocatorTest, SegmentTailsOfAFixedShapeCountOnlyWhenTheDeviceIsNearlyFull) {
  // 16 MiB activations: each leaves the 4 MiB tail of its 20 MiB segment free, 32 MiB in all
  // and a fragmentation above the raise threshold, the same every step. That is the cache's
  // rounding, not a changing shape: no finding on a roomy device...
  const std::vector<size_t> fixed(24, 4096);
  const std::optional<v1::Finding> roomy = MemoryFinding(fixed, 80ull << 30);
  EXPECT_FALSE(roomy.has_value()) << roomy->summary();
  // ...but on a device the rank nearly fills, those 32 MiB are worth getting back.
  const std::optional<v1::Finding> full = MemoryFinding(fixed, 260 * kMiB);
  ASSERT_TRUE(full.has_value()) << "no MEMORY finding on a nearly full device";
  std::map<std::string, double> evidence;
  for (const auto& e : full->evidence()) evidence[e.name()] = e.value();
  EXPECT_GE(evidence["reserved_minus_allocated_bytes"], 32.0 * kMiB) << full->summary();
}

}  // namespace
}  // namespace loom
