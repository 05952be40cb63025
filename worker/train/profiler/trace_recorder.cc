#include "worker/train/profiler/trace_recorder.h"

#include <time.h>

#include <cstdio>

namespace loom::train {

std::unique_ptr<TraceRecorder> TraceRecorder::Open(const std::string& path, int32_t rank,
                                                   int64_t generation, uint32_t capacity) {
  std::string error;
  std::unique_ptr<TraceRing> ring(TraceRing::Create(path, capacity, rank, generation, &error));
  if (!ring) {
    std::fprintf(stderr,
                 "loom-train: note: no timeline for `loomctl trace` (LOOM_TRACE_FILE): %s\n",
                 error.c_str());
    return nullptr;
  }
  return std::make_unique<TraceRecorder>(std::move(ring));
}

int64_t TraceRecorder::BeginStep(int64_t step) {
  step_ = step;
  micro_ = -1;
  timespec real{};
  ::clock_gettime(CLOCK_REALTIME, &real);
  const int64_t steady = Now();
  anchor_ = (int64_t{real.tv_sec} * 1000000000 + real.tv_nsec) - steady;
  return steady;
}

}  // namespace loom::train
