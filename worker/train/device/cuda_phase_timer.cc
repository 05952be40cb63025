#include "worker/train/device/cuda_phase_timer.h"

#include <algorithm>

#include "worker/train/device/cuda_check.h"
#include "worker/train/device/nvtx_range.h"

namespace loom::train {
namespace {

uint32_t PhaseColor(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return kNvtxForward;
    case Phase::kBackward:
      return kNvtxBackward;
    case Phase::kOptimizer:
      return kNvtxOptimizer;
    case Phase::kCommExposed:
      return kNvtxComm;
    default:
      return kNvtxGrey;
  }
}

}  // namespace

CudaPhaseTimer::CudaPhaseTimer(cudaStream_t stream, bool nvtx) : stream_(stream), nvtx_(nvtx) {}

CudaPhaseTimer::~CudaPhaseTimer() {
  if (nvtx_open_) NvtxPop();
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void CudaPhaseTimer::Mark(int phase) {
  const size_t i = marks_.size();
  if (i == events_.size()) {
    cudaEvent_t event;
    LOOM_TRAIN_CUDA_CHECK(cudaEventCreate(&event));  // with timing
    events_.push_back(event);
  }
  LOOM_TRAIN_CUDA_CHECK(cudaEventRecord(events_[i], stream_));
  marks_.push_back(phase);
}

void CudaPhaseTimer::BeginStep() {
  if (nvtx_open_) {
    NvtxPop();
    nvtx_open_ = false;
  }
  marks_.clear();
}

void CudaPhaseTimer::Enter(Phase phase) {
  if (nvtx_) {
    if (nvtx_open_) NvtxPop();
    NvtxPush(PhaseName(phase), PhaseColor(phase));
    nvtx_open_ = true;
  }
  Mark(static_cast<int>(phase));
}

void CudaPhaseTimer::Leave() {
  if (nvtx_open_) {
    NvtxPop();
    nvtx_open_ = false;
  }
  if (!marks_.empty() && marks_.back() >= 0) Mark(-1);
}

PhaseSeconds CudaPhaseTimer::EndStep() {
  Leave();
  PhaseSeconds seconds{};
  spans_.clear();
  if (marks_.empty()) return seconds;
  LOOM_TRAIN_CUDA_CHECK(cudaEventSynchronize(events_[marks_.size() - 1]));
  // Each event's time after the first: the spans' ends, shared by neighbours.
  float previous = 0.0f;
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    float ms = 0.0f, next = 0.0f;
    LOOM_TRAIN_CUDA_CHECK(cudaEventElapsedTime(&next, events_[0], events_[i + 1]));
    next = std::max(next, previous);
    if (marks_[i] >= 0) {
      LOOM_TRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      seconds[static_cast<size_t>(marks_[i])] += ms * 1e-3;
      spans_.push_back({static_cast<Phase>(marks_[i]), previous * 1e-3, next * 1e-3});
    }
    previous = next;
  }
  marks_.clear();
  return seconds;
}

}  // namespace loom::train
