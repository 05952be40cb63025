#include "worker/train/parallel/pipeline_schedule.h"

#include <algorithm>

#include "worker/train/error.h"

namespace loom::train {

PipelineKind ParsePipelineKind(const std::string& name) {
  if (name == "1f1b") return PipelineKind::k1F1B;
  if (name == "gpipe") return PipelineKind::kGPipe;
  throw BadInput("LOOM_LAYOUT schedule", "expected 1f1b or gpipe, got \"" + name + "\"");
}

const char* PipelineKindName(PipelineKind kind) {
  return kind == PipelineKind::kGPipe ? "gpipe" : "1f1b";
}

std::vector<PipeOp> StageSchedule(PipelineKind kind, int stages, int stage, int micro_batches) {
  LOOM_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pipeline stage out of range");
  LOOM_CHECK(micro_batches >= 1, "a pipeline step needs at least one micro-batch");
  const int K = micro_batches;
  std::vector<PipeOp> ops;
  ops.reserve(2 * static_cast<size_t>(K));
  if (kind == PipelineKind::kGPipe) {
    for (int m = 0; m < K; ++m) ops.push_back({PipeOp::kForward, m});
    for (int m = 0; m < K; ++m) ops.push_back({PipeOp::kBackward, m});
    return ops;
  }
  // Warm-up: enough forwards to fill the stages below this one; the last stage needs none.
  const int warmup = std::min(stages - stage - 1, K);
  for (int m = 0; m < warmup; ++m) ops.push_back({PipeOp::kForward, m});
  // Steady state: one forward, then the backward of the oldest micro-batch in flight.
  for (int i = 0; i < K - warmup; ++i) {
    ops.push_back({PipeOp::kForward, warmup + i});
    ops.push_back({PipeOp::kBackward, i});
  }
  // Cool-down: the backwards of the warm-up forwards.
  for (int m = K - warmup; m < K; ++m) ops.push_back({PipeOp::kBackward, m});
  return ops;
}

int SlotsNeeded(const std::vector<PipeOp>& ops) {
  int in_flight = 0, most = 0;
  for (const PipeOp& op : ops) {
    in_flight += op.kind == PipeOp::kForward ? 1 : -1;
    most = std::max(most, in_flight);
  }
  return most;
}

double IdealBubbleRatio(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace loom::train
