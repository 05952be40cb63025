// Pipeline schedules (DESIGN.md, "PP"): the order in which one stage runs the forward and
// backward passes of a step's K micro-batches. Pure functions: no communication, no clock.
//
//   - GPipe: every forward, then every backward (in micro-batch order). A stage keeps all K
//     micro-batches' activations.
//   - 1F1B (PipeDream-flush): stage s of p first runs min(p - s - 1, K) warm-up forwards, then
//     alternates one forward and one backward, then drains the remaining backwards. A stage
//     keeps at most min(p - s, K) micro-batches' activations, and the bubble is the same as
//     GPipe's, (p - 1) / (K + p - 1) of the step.
// Backwards always run in micro-batch order on every stage, so the micro-batches in flight on a
// stage form a contiguous range and micro-batch m can use activation slot m % slots.
#ifndef LOOM_WORKER_TRAIN_PARALLEL_PIPELINE_SCHEDULE_H_
#define LOOM_WORKER_TRAIN_PARALLEL_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

namespace loom::train {

enum class PipelineKind { k1F1B, kGPipe };

// "1f1b" -> k1F1B, "gpipe" -> kGPipe; anything else is an InputError naming LOOM_LAYOUT.
PipelineKind ParsePipelineKind(const std::string& name);
const char* PipelineKindName(PipelineKind kind);

struct PipeOp {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int micro = 0;  // micro-batch index in [0, K)
  bool operator==(const PipeOp& o) const { return kind == o.kind && micro == o.micro; }
};

// The ops of `stage` (0-based, of `stages`) for `micro_batches` micro-batches: each micro-batch
// forwarded once and then backwarded once. Requires 0 <= stage < stages, micro_batches >= 1.
std::vector<PipeOp> StageSchedule(PipelineKind kind, int stages, int stage, int micro_batches);

// The most micro-batches between their forward and their backward at any point of `ops`: the
// activation slots the stage needs.
int SlotsNeeded(const std::vector<PipeOp>& ops);

// The idle fraction of an ideal pipeline with equal stages: (p - 1) / (K + p - 1).
double IdealBubbleRatio(int stages, int micro_batches);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PARALLEL_PIPELINE_SCHEDULE_H_
