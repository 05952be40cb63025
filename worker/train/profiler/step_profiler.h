// The step profiler: wall time of each phase of an optimizer step (steady clock), tokens per
// second, and memory: the bytes the training core allocated itself (in use and peak) and the
// process's resident set size.
#ifndef LOOM_WORKER_TRAIN_PROFILER_STEP_PROFILER_H_
#define LOOM_WORKER_TRAIN_PROFILER_STEP_PROFILER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace loom::train {

// kCommExposed: time the step waited on data-parallel collectives that backward did not hide
// (the gradient buckets, the tied embedding's gradient, the loss and norm, ZeRO-1's gather).
// kBubble: time a pipeline stage waited on its neighbours (a recv of activations or gradients,
// the last sends, the end-of-step drain). Tensor-parallel all-reduces run inside forward and
// backward.
enum class Phase { kData = 0, kForward, kBackward, kOptimizer, kCommExposed, kBubble, kCount };

// The phase names used in progress lines: "data", "forward", "backward", "optimizer",
// "comm_exposed", "bubble".
const char* PhaseName(Phase phase);

struct StepTimes {
  double seconds[static_cast<int>(Phase::kCount)] = {};  // per phase
  double step_seconds = 0.0;                             // the whole step, wall clock
  double tokens_per_second = 0.0;
  double phase(Phase p) const { return seconds[static_cast<int>(p)]; }
};

// Times the phases of one step at a time. Phases may be entered several times per step
// (one per micro-batch); their times add up.
class StepProfiler {
 public:
  using Clock = std::chrono::steady_clock;

  void BeginStep();
  // Ends the phase running (if any) and starts `phase`.
  void Enter(Phase phase);
  // Ends the step that processed `tokens` tokens and returns its times.
  StepTimes EndStep(int64_t tokens);

 private:
  void CloseRunningPhase(Clock::time_point now);

  Clock::time_point step_start_{};
  Clock::time_point phase_start_{};
  int running_ = -1;
  StepTimes current_{};
};

// Bytes the training core allocated (model, optimizer, data), reported by their owners.
class MemoryMeter {
 public:
  // Records the current total; the peak is the largest total ever recorded.
  void Record(size_t bytes_in_use);
  size_t in_use() const { return in_use_; }
  size_t peak() const { return peak_; }

 private:
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

// The process's resident set size in bytes, from /proc/self/statm (0 where unavailable).
size_t ResidentSetBytes();

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PROFILER_STEP_PROFILER_H_
