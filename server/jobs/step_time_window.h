// StepTimeWindow: the measured side of "predicted versus measured step time" (DESIGN.md,
// "Telemetry"). It keeps rank 0's most recent step times and phases of one generation of a job,
// skipping the first steps of the generation as warmup (allocation of the activations, cold
// caches, the first all-reduces), and gives their medians, which one slow step (a checkpoint, a
// noisy neighbour) does not move. MakePlanCheck sets them beside the plan's prediction.
//
// Pure and not thread-safe: the JobManager keeps one per active job under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::jobs {

// One measured step: the whole step and the profiler's phases, in seconds.
struct StepSample {
  double step = 0;
  double data = 0;
  double forward = 0;
  double backward = 0;
  double optimizer = 0;
  double comm_exposed = 0;
  double bubble = 0;
};

class StepTimeWindow {
 public:
  // Training step reports of each generation not measured (the warmup).
  static constexpr int kWarmupSteps = 2;
  // The most recent steps the medians are taken over.
  static constexpr int kMaxSamples = 32;

  // Forgets everything, for a new generation.
  void Reset();
  // Offers one of rank 0's step reports. Kept only when it is a training report (not a
  // validation loss), its step is later than every step offered before (a re-sent report is
  // not counted twice), its step_seconds is finite and positive, and the warmup has passed.
  // Returns whether it was kept.
  bool Add(const v1::StepReport& report);

  int size() const { return static_cast<int>(samples_.size()); }
  // The per-field medians of the kept steps (the mean of the middle two for an even count);
  // nullopt when none is kept.
  std::optional<StepSample> Median() const;

 private:
  std::deque<StepSample> samples_;
  int seen_ = 0;              // training reports accepted as new, warmup included
  int64_t last_step_ = -1;
};

// The PlanCheck of a job with `plan` whose generation `generation` measured `window`; nullopt
// when the window is empty. The ratio is measured / predicted (0 when the plan predicts no
// time).
std::optional<v1::PlanCheck> MakePlanCheck(const v1::Plan& plan, const StepTimeWindow& window,
                                           int64_t generation);

}  // namespace loom::jobs
