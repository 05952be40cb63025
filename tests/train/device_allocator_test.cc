// The caching device allocator over a fake DeviceMemory: byte accounting, pools, best fit,
// coalescing, fragmentation, stream-tagged reuse, the steady state of a repeated GPT-like step
// (no device allocation after the first step) and the out-of-memory path. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "worker/train/device/caching_allocator.h"

namespace loom::train {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// Device memory that hands out addresses without backing them, with a capacity, and events
// whose completion the test decides (CompleteStream stands for the stream catching up).
class FakeDeviceMemory : public DeviceMemory {
 public:
  explicit FakeDeviceMemory(size_t capacity = size_t{1} << 40) : capacity_(capacity) {}

  // Events complete as soon as they are recorded (streams that are always idle).
  void set_events_complete_at_once(bool v) { complete_at_once_ = v; }

  void* Allocate(size_t bytes) override {
    EXPECT_GT(bytes, 0u);
    if (used_ + bytes > capacity_) {
      ++refusals_;
      return nullptr;
    }
    used_ += bytes;
    const uintptr_t addr = next_;
    next_ += bytes + kMiB;  // a gap: segments are never adjacent
    live_[addr] = bytes;
    ++allocs_;
    return reinterpret_cast<void*>(addr);
  }

  void Free(void* ptr) override {
    auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, live_.end()) << "freeing a range that was not allocated";
    used_ -= it->second;
    live_.erase(it);
    ++frees_;
  }

  EventId RecordEvent(StreamId stream) override {
    const uintptr_t id = next_event_++;
    events_[id] = Event{stream, complete_at_once_};
    return static_cast<EventId>(id);
  }

  bool EventDone(EventId event) override {
    auto it = events_.find(static_cast<uintptr_t>(event));
    EXPECT_NE(it, events_.end()) << "querying a released event";
    return it != events_.end() && it->second.done;
  }

  void ReleaseEvent(EventId event) override {
    EXPECT_EQ(events_.erase(static_cast<uintptr_t>(event)), 1u) << "event released twice";
  }

  void CompleteStream(StreamId stream) {
    for (auto& [id, e] : events_) {
      if (e.stream == stream) e.done = true;
    }
  }

  size_t used() const { return used_; }
  size_t live_ranges() const { return live_.size(); }
  size_t live_events() const { return events_.size(); }
  int allocs() const { return allocs_; }
  int frees() const { return frees_; }
  int refusals() const { return refusals_; }

 private:
  struct Event {
    StreamId stream;
    bool done;
  };
  size_t capacity_;
  bool complete_at_once_ = false;
  size_t used_ = 0;
  uintptr_t next_ = uintptr_t{1} << 32;
  uintptr_t next_event_ = 1;
  std::map<uintptr_t, size_t> live_;
  std::map<uintptr_t, Event> events_;
  int allocs_ = 0;
  int frees_ = 0;
  int refusals_ = 0;
};

constexpr StreamId kS1 = static_cast<StreamId>(0x1000);
constexpr StreamId kS2 = static_cast<StreamId>(0x2000);

char* Bytes(void* p) { return static_cast<char*>(p); }

TEST(CachingAllocatorTest, RoundsRequestsAndCountsBytes) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(alloc.Allocate(0), nullptr);
  alloc.Free(nullptr);

  void* a = alloc.Allocate(1);
  void* b = alloc.Allocate(513);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 512, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 512, 0u);
  AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.allocated, 512u + 1024u);
  EXPECT_EQ(s.reserved, CachingAllocator::kSmallSegmentBytes);  // both from one small segment
  EXPECT_EQ(s.num_device_allocs, 1u);
  EXPECT_EQ(s.num_segments, 1u);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.largest_free_block, 2 * kMiB - 1536);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);  // the free memory is one block

  alloc.Free(a);
  s = alloc.GetStats();
  EXPECT_EQ(s.allocated, 1024u);
  EXPECT_EQ(s.peak_allocated, 1536u);
  EXPECT_EQ(s.num_frees, 1u);
  // Free: [a 512 B] [b 1 KiB, in use] [tail]; largest is the tail.
  EXPECT_EQ(s.largest_free_block, 2 * kMiB - 1536);
  EXPECT_DOUBLE_EQ(s.fragmentation, 1.0 - (2.0 * kMiB - 1536) / (2.0 * kMiB - 1024));
  alloc.Free(b);
  s = alloc.GetStats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.largest_free_block, 2 * kMiB);  // everything coalesced back into the segment
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);
  EXPECT_EQ(memory.allocs(), 1);
}

TEST(CachingAllocatorTest, SmallAndLargePoolsUseTheirSegmentSizes) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* small = alloc.Allocate(1 * kMiB);        // the largest small request
  void* large = alloc.Allocate(1 * kMiB + 1);    // the least large request: a 20 MiB segment
  void* huge = alloc.Allocate(30 * kMiB + 100);  // beyond 20 MiB: a segment of its own size
  AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.num_device_allocs, 3u);
  EXPECT_EQ(s.reserved, 2 * kMiB + 20 * kMiB + CachingAllocator::RoundSize(30 * kMiB + 100));
  EXPECT_EQ(s.allocated,
            1 * kMiB + (1 * kMiB + 512) + CachingAllocator::RoundSize(30 * kMiB + 100));
  // A second small request fits the rest of the small segment; it never takes large memory.
  void* small2 = alloc.Allocate(512 * kKiB);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 3u);
  EXPECT_EQ(Bytes(small2), Bytes(small) + 1 * kMiB);
  for (void* p : {small, large, huge, small2}) alloc.Free(p);
  EXPECT_EQ(alloc.GetStats().allocated, 0u);
}

TEST(CachingAllocatorTest, CoalescesFreeNeighboursAndReportsFragmentation) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* a = alloc.Allocate(4 * kMiB);
  void* b = alloc.Allocate(4 * kMiB);
  void* c = alloc.Allocate(4 * kMiB);
  ASSERT_EQ(alloc.GetStats().num_segments, 1u);
  EXPECT_EQ(Bytes(b), Bytes(a) + 4 * kMiB);
  EXPECT_EQ(Bytes(c), Bytes(b) + 4 * kMiB);
  // Segment: [a 4][b 4][c 4][free 8].
  alloc.Free(a);
  alloc.Free(c);  // merges with the 8 MiB tail
  AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.largest_free_block, 12 * kMiB);
  EXPECT_EQ(s.free_reserved(), 16 * kMiB);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.25);  // 1 - 12/16
  // A 14 MiB request fits in no free block although 16 MiB are free: a new segment.
  void* d = alloc.Allocate(14 * kMiB);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  alloc.Free(d);
  alloc.Free(b);  // merges with both neighbours: the segment is one free block again
  s = alloc.GetStats();
  EXPECT_EQ(s.largest_free_block, 20 * kMiB);
  EXPECT_EQ(s.free_reserved(), 40 * kMiB);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.5);  // two whole free segments: 1 - 20/40
  // The whole segment is reusable for a request of its size.
  void* e = alloc.Allocate(20 * kMiB);
  EXPECT_TRUE(e == a || Bytes(e) == Bytes(d));
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  alloc.Free(e);

  alloc.EmptyCache();
  s = alloc.GetStats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.num_segments, 0u);
  EXPECT_EQ(s.num_device_frees, 2u);
  EXPECT_EQ(memory.live_ranges(), 0u);
}

TEST(CachingAllocatorTest, FragmentationOfTheSmallPool) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(alloc.Allocate(512 * kKiB));  // fills the segment
  ASSERT_EQ(alloc.GetStats().num_segments, 1u);
  EXPECT_EQ(alloc.GetStats().largest_free_block, 0u);
  EXPECT_DOUBLE_EQ(alloc.GetStats().fragmentation, 0.0);  // nothing free
  alloc.Free(p[0]);
  alloc.Free(p[2]);
  EXPECT_DOUBLE_EQ(alloc.GetStats().fragmentation, 0.5);  // two 512 KiB holes: 1 - 512/1024
  alloc.Free(p[1]);                                       // joins them: one 1.5 MiB block
  EXPECT_EQ(alloc.GetStats().largest_free_block, 1536 * kKiB);
  EXPECT_DOUBLE_EQ(alloc.GetStats().fragmentation, 0.0);
  alloc.Free(p[3]);
  EXPECT_DOUBLE_EQ(Fragmentation(3, 4), 0.25);
  EXPECT_DOUBLE_EQ(Fragmentation(0, 0), 0.0);
}

TEST(CachingAllocatorTest, TakesTheBestFittingBlock) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  // One 20 MiB segment: [A 3][B 1.5][C 5][D 1.5][E 9] (E takes the last 1 MiB too: a large
  // block keeps a rest of 1 MiB or less rather than splitting it off).
  void* a = alloc.Allocate(3 * kMiB);
  void* b = alloc.Allocate(1536 * kKiB);
  void* c = alloc.Allocate(5 * kMiB);
  void* d = alloc.Allocate(1536 * kKiB);
  void* e = alloc.Allocate(8 * kMiB);
  ASSERT_EQ(alloc.GetStats().num_segments, 1u);
  EXPECT_EQ(alloc.GetStats().allocated, 20 * kMiB);
  alloc.Free(a);
  alloc.Free(c);
  alloc.Free(e);
  // Free: 3, 5, 9 MiB. 4 MiB goes to the 5 MiB block (kept whole: the 1 MiB rest is too small).
  void* x = alloc.Allocate(4 * kMiB);
  EXPECT_EQ(x, c);
  EXPECT_EQ(alloc.GetStats().allocated, 3 * kMiB + 5 * kMiB);
  // 6 MiB goes to the 9 MiB block, split: the 3 MiB rest stays free.
  void* y = alloc.Allocate(6 * kMiB);
  EXPECT_EQ(y, e);
  void* z = alloc.Allocate(3 * kMiB);  // two 3 MiB blocks now; the lower address wins the tie
  EXPECT_EQ(z, a);
  void* w = alloc.Allocate(3 * kMiB);
  EXPECT_EQ(Bytes(w), Bytes(e) + 6 * kMiB);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 1u);
  for (void* p : {b, d, x, y, z, w}) alloc.Free(p);
  EXPECT_EQ(alloc.GetStats().largest_free_block, 20 * kMiB);
}

TEST(CachingAllocatorTest, ReusesABlockOnAnotherStreamOnlyAfterItsEventCompleted) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* a = alloc.Allocate(20 * kMiB, kS1);
  alloc.Free(a);
  // Same stream: at once (stream order keeps new work behind the old).
  void* again = alloc.Allocate(20 * kMiB, kS1);
  EXPECT_EQ(again, a);
  alloc.Free(again);
  // Another stream while kS1 may still use it: a new segment.
  void* b = alloc.Allocate(20 * kMiB, kS2);
  EXPECT_NE(b, a);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  // Once kS1 caught up, kS2 may take a's block.
  memory.CompleteStream(kS1);
  void* c = alloc.Allocate(20 * kMiB, kS2);
  EXPECT_EQ(c, a);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  alloc.Free(b);
  alloc.Free(c);
}

TEST(CachingAllocatorTest, TheRestOfASplitBlockStillWaitsForItsStream) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* a = alloc.Allocate(20 * kMiB, kS1);
  alloc.Free(a);  // kS1's work may still use all 20 MiB
  void* x = alloc.Allocate(4 * kMiB, kS1);
  EXPECT_EQ(x, a);  // the front of the block; the 16 MiB rest is free but not idle
  void* y = alloc.Allocate(4 * kMiB, kS2);
  EXPECT_TRUE(Bytes(y) < Bytes(a) || Bytes(y) >= Bytes(a) + 20 * kMiB);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  memory.CompleteStream(kS1);
  void* z = alloc.Allocate(14 * kMiB, kS2);  // fits either 16 MiB rest; both usable now
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  for (void* p : {x, y, z}) alloc.Free(p);
}

TEST(CachingAllocatorTest, SmallBlocksFollowTheStreamRuleToo) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* a = alloc.Allocate(64 * kKiB, kS1);
  alloc.Free(a);  // the whole small segment is free, pending on kS1
  // kS2 fills a second segment: the first is not usable there yet.
  void* b1 = alloc.Allocate(1 * kMiB, kS2);
  void* b2 = alloc.Allocate(1 * kMiB, kS2);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  EXPECT_TRUE(Bytes(b1) < Bytes(a) || Bytes(b1) >= Bytes(a) + 2 * kMiB);
  EXPECT_EQ(Bytes(b2), Bytes(b1) + 1 * kMiB);
  // On its own stream the first segment is usable at once.
  void* c = alloc.Allocate(1 * kMiB, kS1);
  EXPECT_EQ(c, a);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  for (void* p : {b1, b2, c}) alloc.Free(p);
}

TEST(CachingAllocatorTest, RecordStreamMakesTheBlockWaitForTheOtherStream) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* bucket = alloc.Allocate(25 * kMiB, kS1);
  alloc.RecordStream(bucket, kS2);  // e.g. all-reduced on the communication stream
  alloc.Free(bucket);
  // Even its own stream must wait for kS2's work.
  void* b = alloc.Allocate(25 * kMiB, kS1);
  EXPECT_NE(b, bucket);
  alloc.Free(b);
  memory.CompleteStream(kS2);
  void* c = alloc.Allocate(25 * kMiB, kS1);
  EXPECT_TRUE(c == bucket || c == b);
  alloc.Free(c);
  memory.CompleteStream(kS1);
  // The freed blocks both qualify now; neither needs the device.
  void* d = alloc.Allocate(25 * kMiB, kS2);
  void* e = alloc.Allocate(25 * kMiB, kS2);
  EXPECT_EQ(alloc.GetStats().num_device_allocs, 2u);
  alloc.Free(d);
  alloc.Free(e);
}

// One training step of a GPT-like model: activations of every layer in forward, gradient
// temporaries in backward (reverse order), a gradient bucket on the communication stream, and
// the activations freed as backward passes them. Parameters and gradients stay allocated.
void GptLikeStep(CachingAllocator& alloc, FakeDeviceMemory& memory, int layers, size_t B, size_t T,
                 size_t C, size_t NH, size_t V) {
  const StreamId compute = kS1;
  const StreamId comm = kS2;
  std::vector<std::vector<void*>> acts(layers);
  void* tokens = alloc.Allocate(B * T * 4, compute);
  void* emb = alloc.Allocate(B * T * C * 2, compute);
  for (int l = 0; l < layers; ++l) {
    acts[l].push_back(alloc.Allocate(B * T * C * 2, compute));       // ln1
    acts[l].push_back(alloc.Allocate(B * T * 8, compute));           // ln1 mean, rstd
    acts[l].push_back(alloc.Allocate(B * T * 3 * C * 2, compute));   // qkv
    acts[l].push_back(alloc.Allocate(B * NH * T * T * 2, compute));  // attention probabilities
    acts[l].push_back(alloc.Allocate(B * T * C * 2, compute));       // attention out
    acts[l].push_back(alloc.Allocate(B * T * C * 2, compute));       // residual
    acts[l].push_back(alloc.Allocate(B * T * 4 * C * 2, compute));   // mlp up
    acts[l].push_back(alloc.Allocate(B * T * 4 * C * 2, compute));   // gelu
    acts[l].push_back(alloc.Allocate(B * T * C * 2, compute));       // residual
  }
  void* logits = alloc.Allocate(B * T * V * 2, compute);
  void* losses = alloc.Allocate(B * T * 4, compute);
  void* dlogits = alloc.Allocate(B * T * V * 2, compute);
  alloc.Free(logits);
  void* dresid = alloc.Allocate(B * T * C * 4, compute);
  for (int l = layers - 1; l >= 0; --l) {
    void* scratch = alloc.Allocate(B * T * 4 * C * 2, compute);
    void* dattn = alloc.Allocate(B * NH * T * T * 2, compute);
    alloc.Free(dattn);
    alloc.Free(scratch);
    for (auto it = acts[l].rbegin(); it != acts[l].rend(); ++it) alloc.Free(*it);
    if (l % 4 == 0) {  // a bucket is full: copied out and all-reduced on the comm stream
      void* bucket = alloc.Allocate(25 * kMiB, compute);
      alloc.RecordStream(bucket, comm);
      alloc.Free(bucket);
    }
  }
  for (void* p : {dresid, dlogits, losses, emb, tokens}) alloc.Free(p);
  // The step ends with both streams synchronised (the loss is read on the host).
  memory.CompleteStream(compute);
  memory.CompleteStream(comm);
}

TEST(CachingAllocatorTest, RepeatedStepAllocatesFromTheDeviceOnlyInTheFirstStep) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  const int L = 6;
  const size_t B = 4, T = 256, C = 384, NH = 6, V = 50304;
  std::vector<void*> params;  // persistent: weights, gradients, AdamW moments
  for (int l = 0; l < L; ++l) {
    for (size_t bytes : {3 * C * C, 3 * C, C * C, C, 4 * C * C, 4 * C, 4 * C * C, C, C, C}) {
      params.push_back(alloc.Allocate(bytes * 4 * 4, kS1));
    }
  }
  params.push_back(alloc.Allocate(V * C * 4 * 4, kS1));

  GptLikeStep(alloc, memory, L, B, T, C, NH, V);
  const AllocatorStats first = alloc.GetStats();
  const size_t events_after_first = memory.live_events();
  EXPECT_GT(first.num_device_allocs, 2u);
  for (int step = 0; step < 5; ++step) GptLikeStep(alloc, memory, L, B, T, C, NH, V);
  const AllocatorStats later = alloc.GetStats();
  // The steady state: no device allocation or free, the same memory, no event build-up.
  EXPECT_EQ(later.num_device_allocs, first.num_device_allocs);
  EXPECT_EQ(later.num_device_frees, 0u);
  EXPECT_EQ(later.reserved, first.reserved);
  EXPECT_EQ(later.allocated, first.allocated);
  EXPECT_EQ(later.peak_allocated, first.peak_allocated);
  EXPECT_LE(memory.live_events(), events_after_first);
  EXPECT_EQ(memory.allocs(), static_cast<int>(first.num_device_allocs));

  for (void* p : params) alloc.Free(p);
  EXPECT_EQ(alloc.GetStats().allocated, 0u);
  alloc.EmptyCache();
  EXPECT_EQ(alloc.GetStats().reserved, 0u);
  EXPECT_EQ(memory.used(), 0u);
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetriesOnce) {
  FakeDeviceMemory memory(50 * kMiB);
  CachingAllocator alloc(&memory);
  void* keep = alloc.Allocate(512);  // a 2 MiB small segment
  void* cached = alloc.Allocate(20 * kMiB);
  alloc.Free(cached);                     // 22 MiB reserved, 20 of them cached
  void* big = alloc.Allocate(40 * kMiB);  // fits only once the cached segment is returned
  ASSERT_NE(big, nullptr);
  AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.num_oom_retries, 1u);
  EXPECT_EQ(s.num_device_frees, 1u);
  EXPECT_EQ(s.reserved, 2 * kMiB + 40 * kMiB);
  EXPECT_EQ(memory.refusals(), 1);

  // Now nothing cached can help: the request fails after one retry, with the statistics.
  try {
    alloc.Allocate(30 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("31457280 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("reserved 42.0 MiB"), std::string::npos) << what;
    EXPECT_NE(what.find("allocated 40.0 MiB"), std::string::npos) << what;
  }
  EXPECT_EQ(memory.refusals(), 3);
  s = alloc.GetStats();
  EXPECT_EQ(s.num_oom_retries, 2u);
  EXPECT_EQ(s.allocated, 40 * kMiB + 512);  // the failure changed nothing
  alloc.Free(big);
  alloc.Free(keep);
}

TEST(CachingAllocatorTest, PeaksAndReset) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* a = alloc.Allocate(8 * kMiB);
  void* b = alloc.Allocate(8 * kMiB);
  alloc.Free(a);
  EXPECT_EQ(alloc.GetStats().peak_allocated, 16 * kMiB);
  EXPECT_EQ(alloc.GetStats().peak_reserved, 20 * kMiB);
  alloc.ResetPeak();
  EXPECT_EQ(alloc.GetStats().peak_allocated, 8 * kMiB);
  alloc.Free(b);
  EXPECT_NE(FormatStats(alloc.GetStats()).find("peak allocated 8.0 MiB"), std::string::npos);
}

TEST(CachingAllocatorTest, DestructorReturnsEverySegmentAndEvent) {
  FakeDeviceMemory memory;
  {
    CachingAllocator alloc(&memory);
    alloc.Allocate(100, kS1);  // never freed
    void* b = alloc.Allocate(5 * kMiB, kS1);
    alloc.RecordStream(b, kS2);
    alloc.Free(b);
    alloc.Allocate(3 * kMiB, kS2);  // never freed
    EXPECT_GT(memory.live_events(), 0u);
  }
  EXPECT_EQ(memory.live_ranges(), 0u);
  EXPECT_EQ(memory.live_events(), 0u);
}

TEST(CachingAllocatorTest, ConcurrentThreadsKeepTheBooksStraight) {
  FakeDeviceMemory memory;
  memory.set_events_complete_at_once(true);  // the fake is not thread-safe outside the mutex
  CachingAllocator alloc(&memory);
  auto work = [&alloc](StreamId stream, size_t base) {
    for (int i = 0; i < 2000; ++i) {
      void* a = alloc.Allocate(base + (i % 7) * 4096, stream);
      void* b = alloc.Allocate(2 * kMiB + (i % 5) * kMiB, stream);
      alloc.Free(a);
      alloc.Free(b);
    }
  };
  std::thread t1(work, kS1, 1000);
  std::thread t2(work, kS2, 3000);
  t1.join();
  t2.join();
  const AllocatorStats s = alloc.GetStats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.num_allocs, 8000u);
  EXPECT_EQ(s.num_frees, 8000u);
  EXPECT_EQ(s.reserved, memory.used());
}

TEST(CachingAllocatorDeathTest, FreeingAForeignPointerCrashes) {
  FakeDeviceMemory memory;
  CachingAllocator alloc(&memory);
  void* a = alloc.Allocate(1024);
  EXPECT_DEATH(alloc.Free(Bytes(a) + 512), "not allocated here");
  alloc.Free(a);
}

}  // namespace
}  // namespace loom::train
