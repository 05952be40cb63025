// A caching device allocator (issue 5, "CUDA backend"; DESIGN.md, "memory fragmentation").
//
// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds to milliseconds,
// so the training step must not call them: this allocator takes device memory in segments,
// keeps freed blocks and hands them out again. After the first step of a repeated pattern every
// request is served from the cache (AllocatorStats::num_device_allocs stays put; the tests
// assert it).
//
// Policy:
//  - Requests are rounded up to 512 bytes (keeps every block 512-byte aligned).
//  - Small requests (<= 1 MiB) come from 2 MiB segments, large ones from segments of at least
//    20 MiB (or the rounded size when larger); the two pools never share a segment, so small,
//    short-lived tensors do not pin pieces of the large segments.
//  - A request takes the smallest free block of its pool that fits (best fit) and splits it when
//    the rest is worth keeping (small pool: at least 512 B; large pool: more than 1 MiB).
//  - A freed block merges with the free neighbours in its segment.
//  - Streams: a block belongs to the stream it was allocated on. At Free, an event is recorded on
//    that stream (and on every stream named by RecordStream); the block is reused at once on its
//    own stream (stream order keeps the new work behind the old), and on another stream only
//    once those events have completed. Blocks merged on free keep the events of all their parts
//    (the latest per stream), so a block may wait for several streams.
//  - Out of memory: the allocator releases every wholly free cached segment and retries once;
//    if the device still refuses, it throws OutOfMemoryError with the statistics.
//
// Threading: every public method may be called from any thread; one mutex serialises them.
#ifndef LOOM_WORKER_TRAIN_DEVICE_CACHING_ALLOCATOR_H_
#define LOOM_WORKER_TRAIN_DEVICE_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/train/device/device_memory.h"

namespace loom::train {

// The device could not provide memory even after the cache was emptied. what() names the
// request and the allocator's statistics, e.g. for choosing a smaller micro-batch.
class OutOfMemoryError : public std::runtime_error {
 public:
  explicit OutOfMemoryError(const std::string& message) : std::runtime_error(message) {}
};

struct AllocatorStats {
  size_t allocated = 0;           // bytes in blocks handed out and not yet freed
  size_t reserved = 0;            // bytes of device segments held (allocated + cached)
  size_t peak_allocated = 0;      // largest `allocated` since construction or ResetPeak
  size_t peak_reserved = 0;       // largest `reserved` since construction or ResetPeak
  size_t largest_free_block = 0;  // largest free cached block, in bytes
  // 1 - largest_free_block / (reserved - allocated): 0 when the free memory is one block (or
  // there is none); near 1 when it is scattered in pieces too small for a large request.
  double fragmentation = 0.0;
  uint64_t num_allocs = 0;         // Allocate calls that returned memory
  uint64_t num_frees = 0;          // Free calls
  uint64_t num_device_allocs = 0;  // successful DeviceMemory::Allocate calls (segments)
  uint64_t num_device_frees = 0;   // DeviceMemory::Free calls
  uint64_t num_segments = 0;       // segments held now
  uint64_t num_oom_retries = 0;    // device refusals answered by emptying the cache

  size_t free_reserved() const { return reserved - allocated; }
};

// One line: "allocated 1.0 MiB, reserved 20.0 MiB, peak 3.0 MiB, ..." (for logs and errors).
std::string FormatStats(const AllocatorStats& stats);

// Fragmentation as defined in AllocatorStats; exposed for the profiler and for tests.
double Fragmentation(size_t largest_free_block, size_t free_reserved_bytes);

class CachingAllocator {
 public:
  static constexpr size_t kRoundBytes = 512;
  static constexpr size_t kSmallRequestLimit = size_t{1} << 20;  // <= this: small pool
  static constexpr size_t kSmallSegmentBytes = size_t{2} << 20;
  static constexpr size_t kLargeSegmentBytes = size_t{20} << 20;  // the least large segment

  // `memory` must outlive the allocator.
  explicit CachingAllocator(DeviceMemory* memory);
  // Returns every segment to the device, including those of blocks never freed.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns at least `bytes` of device memory, 512-byte aligned, for use on `stream`; nullptr
  // for 0 bytes. Throws OutOfMemoryError when the device cannot provide it (see the policy).
  void* Allocate(size_t bytes, StreamId stream = StreamId::kDefault);

  // Gives back a pointer returned by Allocate (nullptr is ignored). Work already queued on the
  // block's streams may still use it: see the stream policy. Crashes on any other pointer.
  void Free(void* ptr);

  // Declares that work on `stream` (other than the allocating one) uses the block at `ptr`, so
  // that after Free the block waits for that work too (e.g. a gradient bucket all-reduced on the
  // communication stream). Crashes when `ptr` is not an allocated block.
  void RecordStream(void* ptr, StreamId stream);

  // Returns every wholly free segment to the device. Blocks still in use stay.
  void EmptyCache();

  AllocatorStats GetStats() const;
  // Restarts the peaks from the current values (e.g. per step).
  void ResetPeak();

  // The rounded size a request of `bytes` occupies (for memory models and tests).
  static size_t RoundSize(size_t bytes);

 private:
  struct Block;
  struct PendingEvent;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BySize>;

  FreeSet& PoolOf(const Block* block);
  // The best-fitting free block of the pool usable on `stream`, removed from the pool; nullptr if
  // none.
  Block* TakeFreeBlock(FreeSet& pool, size_t size, StreamId stream);
  // True when the block's pending uses on other streams are over; drops completed events.
  bool UsableOn(Block* block, StreamId stream);
  // Allocates a segment of `segment_bytes` as one block (not in any pool); nullptr on OOM.
  Block* NewSegment(size_t segment_bytes, bool small);
  // Splits `block` (taken from its pool) to `size` when the rest is worth keeping; the rest
  // goes back to the pool.
  void MaybeSplit(Block* block, size_t size);
  // Merges `block` (free, not in the pool) with its free neighbours; returns the merged block.
  Block* Coalesce(Block* block);
  void ReleaseFreeSegments();
  void UpdatePeaks();
  AllocatorStats StatsLocked() const;

  DeviceMemory* const memory_;
  mutable std::mutex mu_;
  FreeSet small_free_;
  FreeSet large_free_;
  std::unordered_map<void*, Block*> in_use_;
  uint64_t next_event_seq_ = 0;
  AllocatorStats stats_;  // counters and byte totals; largest block/fragmentation derived
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_CACHING_ALLOCATOR_H_
