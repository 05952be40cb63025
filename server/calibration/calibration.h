// Calibration of the planner's efficiency table from finished jobs (DESIGN.md, "The planner and
// the doctor": "measured step phases from finished jobs correct the efficiency table").
//
// Model. The planner predicts a step as compute (forward, backward, bubble: GEMMs at a fraction
// of peak, memory-bound kernels at a fraction of bandwidth, a fixed cost per block), the
// optimizer (memory-bound AdamW) and exposed communication. Calibration keeps, per device model,
// three scales of the catalog's table (planner::ScaleEfficiency): compute_scale, optimizer_scale
// and comm_scale multiply those three predicted times. One finished job teaches, by phase,
//   optimizer ratio = measured optimizer / catalog optimizer,
//   comm ratio      = measured exposed communication / catalog communication,
//   compute ratio   = (measured step − measured communication − measured optimizer)
//                     / catalog (forward + backward + bubble),
// where "catalog" is the job's prediction with the scales it was planned with divided out, so
// that a job planned with a calibrated table teaches about the catalog's table, not about the
// calibration. What the planner does not model (data loading, framework overhead) lands in the
// compute ratio, which is what makes the corrected step time match. Without measured phases
// (or with a phase too small to measure) that phase is not learnt: the predicted
// communication stands in for the measured one, and the optimizer counts as compute.
//
// Update. Each ratio is clamped to [min_scale, max_scale] and folded into an exponentially
// weighted geometric mean (ratios compose multiplicatively, so the mean is taken of their
// logarithms): the first job sets the scale, each later one moves it by `weight` of the way.
// The scales are applied to plans once `min_jobs` jobs are folded in.
//
// Pure functions, no clock, store or logging; the Calibrator (calibrator.h) keeps the state.
#pragma once

#include <optional>

#include "loom/v1/job.pb.h"

namespace loom::calibration {

struct CalibrationPolicy {
  // Weight of a new job in the geometric mean (0 < weight <= 1).
  double weight = 0.5;
  // Scales are applied to plans once this many jobs are folded in.
  int min_jobs = 1;
  // A job with fewer measured steps (PlanCheck.measured_steps, after the warmup) teaches
  // nothing: its median is too noisy.
  int min_measured_steps = 3;
  // Every ratio, and so every scale, stays within [min_scale, max_scale]: a job that hung or a
  // clock that jumped must not make the planner absurd.
  // The upper bound leaves room for the catalog's "cpu" entry (a few cores of a server) on a
  // small shared VM, which measured 10-50x slower (docs/benchmarks.md).
  double min_scale = 0.02;
  double max_scale = 50.0;
  // A communication or optimizer phase below this many seconds per step, predicted or measured,
  // is noise next to the step and teaches nothing.
  double min_phase_seconds = 1e-4;
};

// What one finished job teaches about the catalog's table.
struct JobRatios {
  double compute = 1;               // measured / catalog compute, clamped
  std::optional<double> comm;       // measured / catalog communication, clamped; when measurable
  std::optional<double> optimizer;  // measured / catalog optimizer, clamped; when measurable
};

// The ratios of a job whose plan was made with `planned_with` and measured `check`; nullopt
// when it teaches nothing (too few measured steps, no prediction, a measured step that is not
// finite and > 0).
std::optional<JobRatios> RatiosOf(const v1::PlanCheck& check,
                                  const v1::PlanCalibration& planned_with,
                                  const CalibrationPolicy& policy);

// `prior` (jobs 0: nothing learnt yet) with one more job's ratios folded in. The device model
// is kept from `prior`.
v1::PlanCalibration Fold(const v1::PlanCalibration& prior, const JobRatios& ratios,
                         const CalibrationPolicy& policy);

// The calibration plans use for `device_model` given the stored one (nullopt: none): the stored
// scales once jobs >= policy.min_jobs, else the catalog's (jobs 0, scales 1). A comm or
// optimizer scale never learnt is 1.
v1::PlanCalibration Applicable(const std::string& device_model,
                               const std::optional<v1::PlanCalibration>& stored,
                               const CalibrationPolicy& policy);

}  // namespace loom::calibration
