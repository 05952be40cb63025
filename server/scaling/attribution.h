// The arithmetic of a scaling sweep (issue 12, part 5): per-size medians from the ranks' step
// reports, the efficiency against linear scaling, where the lost time went, and the SCALING
// finding. Pure functions over protos and the doctor's telemetry window (no clock, no I/O), so
// they are tested from tables.
//
// The model. Let the first size d0 run a step in T0 seconds with global batch G0 tokens. At size
// d with batch G, linear scaling would take ideal(d) = T0 x (G / G0) x (d0 / d) seconds (the same
// work per device in the same time). The measured step T(d) loses lost = T(d) - ideal(d), and
// efficiency = ideal(d) / T(d) (= tokens/s over d/d0 times the first size's tokens/s). The loss
// is split into buckets that are each MEASURED from the ranks' phases (means over the measured
// steps, see MeasurePoint; busy = forward + backward + optimizer + data, the rank's own
// work). The critical rank is the one with the largest busy time: the step waits for it.
//   comm_exposed  the critical rank's exposed communication
//   bubble        the critical rank's pipeline bubble
//   imbalance     the critical rank's busy minus the mean busy over ranks
//   rest          compute inflation: mean busy minus the ideal busy, busy(d0) x (G/G0) x (d0/d),
//                 with busy(d0) the first size's mean busy
// and `unexplained` = lost minus the four, reported rather than folded into a bucket (mostly the
// per-step overhead outside the phases, which does not shrink with the devices).
//
// Why the critical rank's comm and bubble rather than the median over ranks: a rank that
// finishes its backward early waits for the slowest one inside its gradient all-reduce (or its
// pipeline receive), so its exposed communication contains the imbalance. Counting the median
// rank's comm and the imbalance both counts that wait twice (measured: 6-7 % of the step over-
// explained at 2 and 4 CPU devices); the critical rank's comm is the communication the step
// really waits on. At the
// first size every bucket is measured too, so its comm or bubble shows there (its efficiency is
// 1 by definition).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "loom/v1/scaling.pb.h"
#include "server/doctor/telemetry_window.h"

namespace loom::scaling {

// The efficiency under which a size raises SCALING (warning; critical under kCriticalEfficiency).
inline constexpr double kScalingThreshold = 0.7;
inline constexpr double kCriticalEfficiency = 0.5;

// Rank 0's steps slower than its median by more than kOutlierMads MADs (and 5 %) are dropped.
inline constexpr double kOutlierMads = 5;

// Fills point->ranks, measured_steps, step_seconds and tokens_per_second (from
// point->global_batch_tokens) from the steps in `window` later than `warmup_steps`, and sets
// `measured`. Each rank's figures are MEANS over the same steps (rank 0's outlier steps dropped
// for every rank): the profiler puts every moment of a step in exactly one phase, so a rank's
// mean phases add up to its mean step, which medians do not (measured on CPU devices: medians
// left 6 % of the step unexplained because a rank's exposed communication is bimodal).
// FAILED_PRECONDITION naming the size when a rank of `world_size` has no measured step with
// phases.
absl::Status MeasurePoint(const doctor::TelemetryWindow& window, int world_size,
                          int64_t warmup_steps, v1::ScalePoint* point);

// Computes ideal_step_seconds, efficiency and loss of every measured point against the first
// point (which must be measured; otherwise nothing is computed).
void Attribute(v1::ScaleTest* sweep);

// The sum of the measured buckets of `loss` (without unexplained).
double Explained(const v1::ScalingLoss& loss);

// One SCALING finding per measured size whose efficiency is under `threshold`: the size, the
// efficiency, the buckets as evidence, and a fix chosen by the largest bucket.
std::vector<v1::Finding> ScalingFindings(const v1::ScaleTest& sweep,
                                         double threshold = kScalingThreshold);

}  // namespace loom::scaling
