#include "worker/train/device/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>

#include "worker/train/error.h"

namespace loom::train {
namespace {

// The least remainder worth splitting off a large block: smaller tails would only be useful to
// small requests, which never come to the large pool.
constexpr size_t kLargeSplitRemainder = CachingAllocator::kSmallRequestLimit;

std::string Mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

// An event recorded when a block was freed, shared by every block carved from or merged into
// that block; the event goes back to DeviceMemory when the last holder drops it.
struct CachingAllocator::PendingEvent {
  StreamId stream;
  uint64_t seq;  // recording order: a later event on the same stream subsumes an earlier one
  std::shared_ptr<const EventId> event;
};

// A range of a segment. The blocks of a segment form a doubly linked list in address order;
// a segment is wholly free when its only block is free (no prev, no next).
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  bool small = false;                    // pool: small (<= 1 MiB requests) or large
  bool allocated = false;                // handed out (in in_use_) rather than cached (in a pool)
  StreamId stream = StreamId::kDefault;  // the stream of the latest allocation
  std::vector<StreamId> used_on;         // other streams named by RecordStream (while allocated)
  std::vector<PendingEvent> pending;     // while free: uses that may still be running
  Block* prev = nullptr;
  Block* next = nullptr;
};

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->size, a->ptr) < std::tie(b->size, b->ptr);
}

double Fragmentation(size_t largest_free_block, size_t free_reserved_bytes) {
  if (free_reserved_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free_reserved_bytes);
}

std::string FormatStats(const AllocatorStats& s) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "fragmentation %.3f", s.fragmentation);
  return "allocated " + Mib(s.allocated) + ", reserved " + Mib(s.reserved) + ", peak allocated " +
         Mib(s.peak_allocated) + ", peak reserved " + Mib(s.peak_reserved) +
         ", largest free block " + Mib(s.largest_free_block) + ", " + buf + ", " +
         std::to_string(s.num_segments) + " segments, " + std::to_string(s.num_device_allocs) +
         " device allocations, " + std::to_string(s.num_device_frees) + " device frees";
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes == 0) return kRoundBytes;
  if (bytes > std::numeric_limits<size_t>::max() - kRoundBytes) {
    return std::numeric_limits<size_t>::max() / kRoundBytes * kRoundBytes;  // fails at the device
  }
  return (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
}

CachingAllocator::CachingAllocator(DeviceMemory* memory) : memory_(memory) {
  LOOM_CHECK(memory_ != nullptr, "CachingAllocator: no device memory");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Every segment has exactly one head block (no prev); reach them from any block.
  std::vector<Block*> heads;
  auto add_head = [&](Block* b) {
    while (b->prev != nullptr) b = b->prev;
    heads.push_back(b);
  };
  for (Block* b : small_free_) add_head(b);
  for (Block* b : large_free_) add_head(b);
  for (auto& [ptr, b] : in_use_) add_head(b);
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  for (Block* head : heads) {
    memory_->Free(head->ptr);
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;  // drops pending events: released through memory_, which is still alive
      b = next;
    }
  }
}

CachingAllocator::FreeSet& CachingAllocator::PoolOf(const Block* block) {
  return block->small ? small_free_ : large_free_;
}

bool CachingAllocator::UsableOn(Block* block, StreamId stream) {
  bool usable = true;
  auto& pending = block->pending;
  for (size_t i = 0; i < pending.size();) {
    if (memory_->EventDone(*pending[i].event)) {
      pending[i] = std::move(pending.back());
      pending.pop_back();
      continue;
    }
    if (pending[i].stream != stream) usable = false;
    ++i;
  }
  return usable;
}

CachingAllocator::Block* CachingAllocator::TakeFreeBlock(FreeSet& pool, size_t size,
                                                         StreamId stream) {
  Block key;
  key.size = size;
  for (auto it = pool.lower_bound(&key); it != pool.end(); ++it) {
    Block* block = *it;
    if (!UsableOn(block, stream)) continue;
    pool.erase(it);
    return block;
  }
  return nullptr;
}

CachingAllocator::Block* CachingAllocator::NewSegment(size_t segment_bytes, bool small) {
  void* ptr = memory_->Allocate(segment_bytes);
  if (ptr == nullptr) return nullptr;
  auto* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = segment_bytes;
  block->small = small;
  ++stats_.num_device_allocs;
  ++stats_.num_segments;
  stats_.reserved += segment_bytes;
  return block;
}

void CachingAllocator::MaybeSplit(Block* block, size_t size) {
  const size_t rest = block->size - size;
  const bool worth = block->small ? rest >= kRoundBytes : rest > kLargeSplitRemainder;
  if (!worth) return;
  auto* tail = new Block;
  tail->ptr = block->ptr + size;
  tail->size = rest;
  tail->small = block->small;
  tail->stream = block->stream;
  // The tail may still be in use by the work the events stand for (all of it on the new
  // block's stream, which UsableOn checked), so it keeps them.
  tail->pending = block->pending;
  tail->prev = block;
  tail->next = block->next;
  if (block->next != nullptr) block->next->prev = tail;
  block->next = tail;
  block->size = size;
  PoolOf(tail).insert(tail);
}

CachingAllocator::Block* CachingAllocator::Coalesce(Block* block) {
  auto absorb = [](Block* into, Block* from) {
    // Keep, per stream, only the latest event: it completes after every earlier one there.
    for (PendingEvent& p : from->pending) {
      auto same = std::find_if(into->pending.begin(), into->pending.end(),
                               [&](const PendingEvent& q) { return q.stream == p.stream; });
      if (same == into->pending.end()) {
        into->pending.push_back(std::move(p));
      } else if (same->seq < p.seq) {
        *same = std::move(p);
      }
    }
  };
  Block* prev = block->prev;
  if (prev != nullptr && !prev->allocated) {
    PoolOf(prev).erase(prev);
    absorb(prev, block);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  Block* next = block->next;
  if (next != nullptr && !next->allocated) {
    PoolOf(next).erase(next);
    absorb(block, next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  return block;
}

void* CachingAllocator::Allocate(size_t bytes, StreamId stream) {
  if (bytes == 0) return nullptr;
  const size_t size = RoundSize(bytes);
  const bool small = size <= kSmallRequestLimit;
  std::lock_guard<std::mutex> lock(mu_);
  FreeSet& pool = small ? small_free_ : large_free_;
  Block* block = TakeFreeBlock(pool, size, stream);
  if (block == nullptr) {
    const size_t segment_bytes = small ? kSmallSegmentBytes : std::max(size, kLargeSegmentBytes);
    block = NewSegment(segment_bytes, small);
    if (block == nullptr) {
      // Cached segments may be what the device lacks: give them back and try once more.
      ++stats_.num_oom_retries;
      ReleaseFreeSegments();
      block = NewSegment(segment_bytes, small);
    }
    if (block == nullptr) {
      throw OutOfMemoryError("device out of memory: a request of " + std::to_string(bytes) +
                             " bytes needed a new segment of " + Mib(segment_bytes) +
                             " and the device refused it even after the cache was emptied; " +
                             FormatStats(StatsLocked()));
    }
  }
  block->stream = stream;
  block->allocated = true;
  MaybeSplit(block, size);  // before the events go: the tail keeps them
  // Stream order covers the block's pending uses on `stream`; the others are over (UsableOn).
  block->pending.clear();
  in_use_.emplace(block->ptr, block);
  stats_.allocated += block->size;
  ++stats_.num_allocs;
  UpdatePeaks();
  return block->ptr;
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(ptr);
  LOOM_CHECK(it != in_use_.end(), "CachingAllocator::Free: pointer not allocated here");
  Block* block = it->second;
  in_use_.erase(it);
  stats_.allocated -= block->size;
  ++stats_.num_frees;
  block->allocated = false;
  auto record = [&](StreamId s) {
    EventId e = memory_->RecordEvent(s);
    DeviceMemory* memory = memory_;
    block->pending.push_back(
        PendingEvent{s, next_event_seq_++,
                     std::shared_ptr<const EventId>(new EventId(e), [memory](const EventId* p) {
                       memory->ReleaseEvent(*p);
                       delete p;
                     })});
  };
  record(block->stream);
  for (StreamId s : block->used_on) record(s);
  block->used_on.clear();
  block = Coalesce(block);
  PoolOf(block).insert(block);
}

void CachingAllocator::RecordStream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(ptr);
  LOOM_CHECK(it != in_use_.end(), "CachingAllocator::RecordStream: pointer not allocated here");
  Block* block = it->second;
  if (stream == block->stream) return;
  if (std::find(block->used_on.begin(), block->used_on.end(), stream) == block->used_on.end()) {
    block->used_on.push_back(stream);
  }
}

void CachingAllocator::ReleaseFreeSegments() {
  for (FreeSet* pool : {&small_free_, &large_free_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      // DeviceMemory::Free waits for work still using the segment, so pending events need no
      // check here.
      memory_->Free(block->ptr);
      stats_.reserved -= block->size;
      ++stats_.num_device_frees;
      --stats_.num_segments;
      delete block;
    }
  }
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseFreeSegments();
}

void CachingAllocator::UpdatePeaks() {
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
}

AllocatorStats CachingAllocator::StatsLocked() const {
  AllocatorStats s = stats_;
  s.peak_reserved = std::max(s.peak_reserved, s.reserved);
  s.largest_free_block = 0;
  if (!small_free_.empty()) s.largest_free_block = (*small_free_.rbegin())->size;
  if (!large_free_.empty()) {
    s.largest_free_block = std::max(s.largest_free_block, (*large_free_.rbegin())->size);
  }
  s.fragmentation = Fragmentation(s.largest_free_block, s.free_reserved());
  return s;
}

AllocatorStats CachingAllocator::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return StatsLocked();
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

}  // namespace loom::train
