// TraceRecorder: what the trainer calls to put its phases into the rank's trace ring
// (trace_ring.h). Every step, every rank: a record costs two steady-clock reads and one 64-byte
// store into the mapped file (docs/benchmarks.md has the measured overhead).
//
// Instants are steady-clock (CLOCK_MONOTONIC) nanoseconds from Now(); BeginStep takes an anchor
// (the real-time clock and the steady clock read together) that converts them to
// CLOCK_REALTIME for the ring, so ranks on different hosts share one timeline.
//
// Threading: the training thread only.
#ifndef LOOM_WORKER_TRAIN_PROFILER_TRACE_RECORDER_H_
#define LOOM_WORKER_TRAIN_PROFILER_TRACE_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/train/profiler/trace_ring.h"

namespace loom::train {

class TraceRecorder {
 public:
  // The ring at `path` (created or truncated). On failure prints one line on stderr naming the
  // path and returns nullptr: the rank trains on without a timeline.
  static std::unique_ptr<TraceRecorder> Open(const std::string& path, int32_t rank,
                                             int64_t generation,
                                             uint32_t capacity = kDefaultTraceCapacity);
  explicit TraceRecorder(std::unique_ptr<TraceRing> ring) : ring_(std::move(ring)) {}

  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static int64_t Nanos(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }

  // Starts step `step` (1-based): takes the clock anchor. Returns Now().
  int64_t BeginStep(int64_t step);
  // The micro-batch that nested records (a tensor-parallel all-reduce inside a block) belong to;
  // -1 outside micro-batches.
  void set_micro(int32_t micro) { micro_ = micro; }
  int32_t micro() const { return micro_; }
  int64_t step() const { return step_; }

  // One record of the current step, from steady instants `start` to `end`.
  void Record(TraceKind kind, int64_t start, int64_t end, int32_t micro, uint64_t bytes = 0,
              int32_t aux = -1) {
    ring_->Append(kind, start + anchor_, end - start, step_, micro, bytes, aux);
  }
  // From `start` to now.
  void Since(TraceKind kind, int64_t start, int32_t micro, uint64_t bytes = 0, int32_t aux = -1) {
    Record(kind, start, Now(), micro, bytes, aux);
  }

  const TraceRing& ring() const { return *ring_; }

 private:
  std::unique_ptr<TraceRing> ring_;
  int64_t anchor_ = 0;  // real - steady, in ns
  int64_t step_ = 0;
  int32_t micro_ = -1;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PROFILER_TRACE_RECORDER_H_
