#include "worker/train/profiler/step_profiler.h"

#include <unistd.h>

#include <cstdio>

namespace loom::train {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return "data";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kCommExposed:
      return "comm_exposed";
    case Phase::kBubble:
      return "bubble";
    case Phase::kCount:
      break;
  }
  return "?";
}

void StepProfiler::BeginStep() {
  current_ = StepTimes{};
  running_ = -1;
  step_start_ = Clock::now();
}

void StepProfiler::CloseRunningPhase(Clock::time_point now) {
  if (running_ >= 0) {
    current_.seconds[running_] += std::chrono::duration<double>(now - phase_start_).count();
  }
}

void StepProfiler::Enter(Phase phase) {
  Clock::time_point now = Clock::now();
  CloseRunningPhase(now);
  running_ = static_cast<int>(phase);
  phase_start_ = now;
}

StepTimes StepProfiler::EndStep(int64_t tokens) {
  Clock::time_point now = Clock::now();
  CloseRunningPhase(now);
  running_ = -1;
  current_.step_seconds = std::chrono::duration<double>(now - step_start_).count();
  current_.tokens_per_second =
      current_.step_seconds > 0 ? static_cast<double>(tokens) / current_.step_seconds : 0.0;
  return current_;
}

void MemoryMeter::Record(size_t bytes_in_use) {
  in_use_ = bytes_in_use;
  if (bytes_in_use > peak_) peak_ = bytes_in_use;
}

size_t ResidentSetBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size_pages = 0, resident_pages = 0;
  int n = std::fscanf(f, "%lu %lu", &size_pages, &resident_pages);
  std::fclose(f);
  if (n != 2) return 0;
  return static_cast<size_t>(resident_pages) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace loom::train
