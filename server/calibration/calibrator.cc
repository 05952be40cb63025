#include "server/calibration/calibrator.h"

#include <utility>

#include "common/status_macros.h"

namespace loom::calibration {

absl::StatusOr<std::unique_ptr<Calibrator>> Calibrator::Create(CalibrationStore* store,
                                                               const Clock* clock,
                                                               CalibrationPolicy policy) {
  std::unique_ptr<Calibrator> c(new Calibrator(store, clock, policy));
  ASSIGN_OR_RETURN(std::vector<v1::PlanCalibration> stored, store->ListCalibrations());
  absl::MutexLock lock(&c->mu_);
  for (v1::PlanCalibration& s : stored) {
    const std::string model = s.device_model();
    c->stored_[model] = std::move(s);
  }
  return c;
}

absl::StatusOr<std::optional<v1::PlanCalibration>> Calibrator::LearnFromFinishedJob(
    const v1::Job& job) {
  const v1::PlanCalibration& planned_with = job.plan().calibration();
  if (!job.has_plan() || planned_with.device_model().empty() || !job.has_plan_check()) {
    return std::nullopt;
  }
  const std::optional<JobRatios> ratios = RatiosOf(job.plan_check(), planned_with, policy_);
  if (!ratios.has_value()) return std::nullopt;

  absl::MutexLock lock(&mu_);
  v1::PlanCalibration prior;
  prior.set_device_model(planned_with.device_model());
  if (auto it = stored_.find(prior.device_model()); it != stored_.end()) prior = it->second;
  v1::PlanCalibration updated = Fold(prior, *ratios, policy_);
  CalibrationRecord record;
  record.job = job.name();
  record.planned_with = planned_with;
  record.check = job.plan_check();
  record.time = clock_->Now();
  ASSIGN_OR_RETURN(const bool recorded, store_->Record(record, updated));
  if (!recorded) return std::nullopt;
  stored_[updated.device_model()] = updated;
  return updated;
}

CalibrationByModel Calibrator::Applicable() const {
  absl::MutexLock lock(&mu_);
  CalibrationByModel out;
  for (const auto& [model, stored] : stored_) {
    v1::PlanCalibration c = calibration::Applicable(model, stored, policy_);
    if (c.jobs() > 0) out.emplace(model, std::move(c));
  }
  return out;
}

}  // namespace loom::calibration
