// Calibrator: loomd's calibration of the planner. It learns from every job that SUCCEEDED with a
// plan made by loomd (Job.plan.calibration names the device model and the scales the plan used)
// and a measured step time (Job.plan_check), folding it into that device model's scales
// (calibration.h) and persisting both in the CalibrationStore; and it hands the scales to the
// planner for PlanJob and CreateJob with `auto` (planner_service::PlanJob and PlanAutoLayout).
//
// Threading: thread-safe. Learning writes to the store under the calibrator's own mutex (the
// JobManager calls it under its lock, so the store must not call back into the manager);
// Applicable() reads an in-memory copy and never touches the store.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "loom/v1/job.pb.h"
#include "server/calibration/calibration.h"
#include "server/calibration/calibration_store.h"

namespace loom::calibration {

// Calibrations by device model, as planner_service takes them.
using CalibrationByModel = std::map<std::string, v1::PlanCalibration, std::less<>>;

class Calibrator {
 public:
  // Loads the stored calibrations. `store` and `clock` must outlive the calibrator.
  static absl::StatusOr<std::unique_ptr<Calibrator>> Create(CalibrationStore* store,
                                                            const Clock* clock,
                                                            CalibrationPolicy policy = {});

  // Learns from a finished job. Returns the device model's updated calibration, or nullopt
  // when the job teaches nothing: no plan made by loomd, no PlanCheck, too few measured steps
  // (RatiosOf), or a job learnt from before. A store error is returned and changes nothing.
  absl::StatusOr<std::optional<v1::PlanCalibration>> LearnFromFinishedJob(const v1::Job& job);

  // The calibration of every device model that has one plans should use (jobs >= min_jobs);
  // a model that is absent plans with the catalog's defaults.
  CalibrationByModel Applicable() const;

  const CalibrationPolicy& policy() const { return policy_; }

 private:
  Calibrator(CalibrationStore* store, const Clock* clock, CalibrationPolicy policy)
      : store_(store), clock_(clock), policy_(policy) {}

  CalibrationStore* const store_;
  const Clock* const clock_;
  const CalibrationPolicy policy_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::PlanCalibration> stored_ ABSL_GUARDED_BY(mu_);  // as in the store
};

}  // namespace loom::calibration
