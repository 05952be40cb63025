// CudaPhaseTimer: the step profiler's phase times on a GPU, measured by CUDA events on the
// compute stream (the host's clock would only time the kernel launches), with an NVTX range
// per phase so Nsight Systems shows the same phases.
#ifndef LOOM_WORKER_TRAIN_DEVICE_CUDA_PHASE_TIMER_H_
#define LOOM_WORKER_TRAIN_DEVICE_CUDA_PHASE_TIMER_H_

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <vector>

#include "worker/train/profiler/step_profiler.h"

namespace loom::train {

using PhaseSeconds = std::array<double, static_cast<size_t>(Phase::kCount)>;

// Usage per step: BeginStep(); Enter(kForward) ... Enter(kBackward) ... Enter(kOptimizer) ...;
// EndStep() returns the device seconds of each phase (phases entered several times add up).
// Events are pooled: after the first step no events are created.
// Threading: one thread (the one driving the stream); NVTX ranges are pushed on it.
class CudaPhaseTimer {
 public:
  // `stream` must outlive the timer. nvtx: also open an NVTX range per phase.
  explicit CudaPhaseTimer(cudaStream_t stream, bool nvtx = true);
  ~CudaPhaseTimer();
  CudaPhaseTimer(const CudaPhaseTimer&) = delete;
  CudaPhaseTimer& operator=(const CudaPhaseTimer&) = delete;

  // Starts a step (a step left open is discarded).
  void BeginStep();
  // Ends the running phase, if any, and starts `phase` at this point of the stream.
  void Enter(Phase phase);
  // Ends the running phase; stream time until the next Enter belongs to no phase.
  void Leave();
  // Ends the step, blocks until the stream has run its work, and returns the seconds of each
  // phase: device time between the events that opened and closed it.
  PhaseSeconds EndStep();

  // Each phase entered in the last EndStep's step, in order: its start and end in device
  // seconds after the step's first event (the per-rank timeline, profiler/trace_ring.h). One
  // phase's end is the next one's start, exactly.
  struct Span {
    Phase phase;
    double start = 0.0;
    double end = 0.0;
  };
  const std::vector<Span>& spans() const { return spans_; }

  // Events created so far (for tests: constant after the first step of a repeated pattern).
  size_t events_created() const { return events_.size(); }

 private:
  // Records the next pooled event, opening `phase` (-1: none).
  void Mark(int phase);

  cudaStream_t stream_;
  bool nvtx_;
  bool nvtx_open_ = false;
  std::vector<cudaEvent_t> events_;  // pool; events_[i] belongs to marks_[i]
  std::vector<int> marks_;           // phase opened by each recorded event this step
  std::vector<Span> spans_;          // the last step's phases
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_CUDA_PHASE_TIMER_H_
