// Goodput (issue 12, part 8): productive training time over the wall time since a job was
// submitted, with the lost time in named buckets (v1::Goodput).
//
// The ledger is fed by the job manager (server/jobs/): every state change, rank 0's step and
// checkpoint reports. It attributes wall time by segment:
//   QUEUED before the first placement                      -> queued
//   RESTARTING, and QUEUED after it, until placed again    -> restarts, or rebalancing when the
//                                                            gang was re-queued by the doctor
//   SCHEDULED, and RUNNING until the generation's first step -> starting
//   RUNNING after it: the steps' own measured seconds       -> productive
//                     the checkpoints' measured seconds     -> checkpointing
// and `other` is the remainder (evaluation, gaps between steps, a loomd restart), so that the
// buckets sum to the wall time. When a generation's first step shows that it resumed before the
// highest step reached (the steps after the last checkpoint are trained again), those steps'
// seconds (at the mean kept step time) move from productive to the bucket of the interruption.
//
// Pure: times are passed in; no clock, store or logging. Not thread-safe (the job manager calls
// it under its lock).
#pragma once

#include <cstdint>

#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::doctor {

// Why a job is waiting to be placed.
enum class WaitCause { kQueued, kRestart, kRebalance };

class GoodputLedger {
 public:
  GoodputLedger() = default;
  // A job created at `create_time`; `persisted` is the last snapshot written (after a loomd
  // restart), or empty for a new job. `state` is the job's state now; `now` starts its segment
  // (the time loomd was away is in nothing, hence in `other`).
  GoodputLedger(absl::Time create_time, const v1::Goodput& persisted, v1::JobState state,
                absl::Time now);

  // The job entered `state` at `now`. `cause` says why a RESTARTING (or QUEUED) job waits;
  // ignored for other states.
  void EnterState(v1::JobState state, WaitCause cause, absl::Time now);

  // Rank 0 of generation `generation` reported training step `step` (1-based) that took
  // `step_seconds`, at `now`. Steps of an older generation than the last one seen are ignored.
  void Step(int64_t generation, int64_t step, double step_seconds, absl::Time now);

  // A checkpoint was saved in `seconds` (rank 0's measurement).
  void Checkpoint(double seconds);

  // The accounting up to `now` (the open segment included as if it closed now).
  v1::Goodput Snapshot(absl::Time now) const;

 private:
  enum class Segment { kNone, kWaiting, kStarting, kRunning, kDone };
  // Attributes [open_since_, now) of the current segment and opens the next at `now`.
  void Close(absl::Time now, v1::Goodput& into) const;

  absl::Time create_time_;
  v1::Goodput g_;  // closed segments and the step/checkpoint sums
  Segment segment_ = Segment::kNone;
  WaitCause cause_ = WaitCause::kQueued;
  absl::Time open_since_;
  absl::Time end_time_;  // set in kDone
  int64_t generation_ = 0;
  bool generation_started_ = false;  // the current generation reported a step
};

}  // namespace loom::doctor
