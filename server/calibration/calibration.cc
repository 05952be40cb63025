#include "server/calibration/calibration.h"

#include <algorithm>
#include <cmath>

namespace loom::calibration {
namespace {

double Clamp(double ratio, const CalibrationPolicy& p) {
  return std::clamp(ratio, p.min_scale, p.max_scale);
}

// A stored scale, or 1 when it is missing or unusable (a plan made before calibration existed).
double ScaleOr1(double scale) { return std::isfinite(scale) && scale > 0 ? scale : 1.0; }

// Forward, backward and bubble: what compute_scale multiplies.
double Compute(const v1::PlanPhases& p) { return p.forward() + p.backward() + p.bubble(); }

bool HasPhases(const v1::PlanPhases& p) {
  return Compute(p) > 0 || p.optimizer() > 0 || p.comm_exposed() > 0;
}

bool Finite(const v1::PlanPhases& p) {
  return std::isfinite(Compute(p)) && std::isfinite(p.optimizer()) &&
         std::isfinite(p.comm_exposed());
}

// The geometric mean of `prior` (weight 1 − w) and `sample` (weight w).
double Blend(double prior, double sample, double w) {
  return std::exp((1.0 - w) * std::log(prior) + w * std::log(sample));
}

// `prior` (learnt from `jobs` jobs) with `sample` folded in.
double FoldScale(int jobs, double prior, double sample, const CalibrationPolicy& p) {
  const double s = Clamp(sample, p);
  if (jobs <= 0) return s;
  return Clamp(Blend(ScaleOr1(prior), s, std::clamp(p.weight, 1e-6, 1.0)), p);
}

}  // namespace

std::optional<JobRatios> RatiosOf(const v1::PlanCheck& check,
                                  const v1::PlanCalibration& planned_with,
                                  const CalibrationPolicy& policy) {
  const double measured_step = check.measured_step_seconds();
  if (check.measured_steps() < policy.min_measured_steps || !std::isfinite(measured_step) ||
      measured_step <= 0) {
    return std::nullopt;
  }
  const v1::PlanPhases& predicted = check.predicted_phases();
  const v1::PlanPhases& measured = check.measured_phases();
  if (!Finite(predicted) || !Finite(measured)) return std::nullopt;
  const double compute_scale = ScaleOr1(planned_with.compute_scale());
  const double comm_scale = ScaleOr1(planned_with.comm_scale());
  const double optimizer_scale =
      planned_with.optimizer_jobs() > 0 ? ScaleOr1(planned_with.optimizer_scale()) : compute_scale;

  // The prediction as planned, then as the catalog's table would have made it.
  double planned_compute = Compute(predicted);
  double planned_optimizer = predicted.optimizer();
  double planned_comm = predicted.comm_exposed();
  if (!HasPhases(predicted)) {  // a plan without phases: all of it counts as compute
    planned_compute = check.predicted_step_seconds();
    planned_optimizer = 0;
    planned_comm = 0;
  }
  const double catalog_compute = planned_compute / compute_scale;
  const double catalog_optimizer = planned_optimizer / optimizer_scale;
  const double catalog_comm = planned_comm / comm_scale;
  const double catalog_work = catalog_compute + catalog_optimizer;
  if (!std::isfinite(catalog_work) || catalog_work <= 0) return std::nullopt;

  const bool measured_phases = HasPhases(measured);
  const double measured_comm = measured_phases ? measured.comm_exposed() : planned_comm;
  const double min = policy.min_phase_seconds;
  JobRatios r;
  if (measured_phases && catalog_comm >= min && measured_comm >= min) {
    r.comm = Clamp(measured_comm / catalog_comm, policy);
  }
  const double rest = std::max(measured_step - measured_comm, 0.0);  // compute and optimizer
  if (measured_phases && catalog_optimizer >= min && measured.optimizer() >= min) {
    r.optimizer = Clamp(measured.optimizer() / catalog_optimizer, policy);
    r.compute = catalog_compute > 0
                    ? Clamp(std::max(rest - measured.optimizer(), 0.0) / catalog_compute, policy)
                    : *r.optimizer;
  } else {
    r.compute = Clamp(rest / catalog_work, policy);
  }
  return r;
}

v1::PlanCalibration Fold(const v1::PlanCalibration& prior, const JobRatios& ratios,
                         const CalibrationPolicy& policy) {
  v1::PlanCalibration next = prior;
  next.set_compute_scale(FoldScale(prior.jobs(), prior.compute_scale(), ratios.compute, policy));
  next.set_jobs(std::max(0, prior.jobs()) + 1);
  next.set_comm_jobs(std::max(0, prior.comm_jobs()));
  next.set_comm_scale(ScaleOr1(prior.comm_scale()));
  if (ratios.comm.has_value()) {
    next.set_comm_scale(FoldScale(prior.comm_jobs(), prior.comm_scale(), *ratios.comm, policy));
    next.set_comm_jobs(next.comm_jobs() + 1);
  }
  next.set_optimizer_jobs(std::max(0, prior.optimizer_jobs()));
  next.set_optimizer_scale(ScaleOr1(prior.optimizer_scale()));
  if (ratios.optimizer.has_value()) {
    next.set_optimizer_scale(
        FoldScale(prior.optimizer_jobs(), prior.optimizer_scale(), *ratios.optimizer, policy));
    next.set_optimizer_jobs(next.optimizer_jobs() + 1);
  }
  return next;
}

v1::PlanCalibration Applicable(const std::string& device_model,
                               const std::optional<v1::PlanCalibration>& stored,
                               const CalibrationPolicy& policy) {
  v1::PlanCalibration c;
  c.set_device_model(device_model);
  c.set_compute_scale(1.0);
  c.set_comm_scale(1.0);
  c.set_optimizer_scale(1.0);
  if (!stored.has_value() || stored->jobs() < std::max(1, policy.min_jobs)) return c;
  c.set_jobs(stored->jobs());
  c.set_compute_scale(ScaleOr1(stored->compute_scale()));
  c.set_comm_jobs(std::max(0, stored->comm_jobs()));
  c.set_comm_scale(c.comm_jobs() > 0 ? ScaleOr1(stored->comm_scale()) : 1.0);
  c.set_optimizer_jobs(std::max(0, stored->optimizer_jobs()));
  c.set_optimizer_scale(c.optimizer_jobs() > 0 ? ScaleOr1(stored->optimizer_scale()) : 1.0);
  return c;
}

}  // namespace loom::calibration
