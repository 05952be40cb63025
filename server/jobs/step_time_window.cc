#include "server/jobs/step_time_window.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace loom::jobs {
namespace {

double PhaseOf(const v1::StepReport& report, const char* name) {
  auto it = report.phase_seconds().find(name);
  if (it == report.phase_seconds().end() || !std::isfinite(it->second) || it->second < 0) return 0;
  return it->second;
}

template <typename Field>
double MedianOf(const std::deque<StepSample>& samples, Field field) {
  std::vector<double> values;
  values.reserve(samples.size());
  for (const StepSample& s : samples) values.push_back(s.*field);
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

void StepTimeWindow::Reset() {
  samples_.clear();
  seen_ = 0;
  last_step_ = -1;
}

bool StepTimeWindow::Add(const v1::StepReport& report) {
  if (report.has_val_loss() || report.step() <= last_step_) return false;
  last_step_ = report.step();
  if (++seen_ <= kWarmupSteps) return false;
  if (!std::isfinite(report.step_seconds()) || report.step_seconds() <= 0) return false;
  StepSample s;
  s.step = report.step_seconds();
  s.data = PhaseOf(report, "data");
  s.forward = PhaseOf(report, "forward");
  s.backward = PhaseOf(report, "backward");
  s.optimizer = PhaseOf(report, "optimizer");
  s.comm_exposed = PhaseOf(report, "comm_exposed");
  s.bubble = PhaseOf(report, "bubble");
  samples_.push_back(s);
  if (samples_.size() > kMaxSamples) samples_.pop_front();
  return true;
}

std::optional<StepSample> StepTimeWindow::Median() const {
  if (samples_.empty()) return std::nullopt;
  StepSample m;
  m.step = MedianOf(samples_, &StepSample::step);
  m.data = MedianOf(samples_, &StepSample::data);
  m.forward = MedianOf(samples_, &StepSample::forward);
  m.backward = MedianOf(samples_, &StepSample::backward);
  m.optimizer = MedianOf(samples_, &StepSample::optimizer);
  m.comm_exposed = MedianOf(samples_, &StepSample::comm_exposed);
  m.bubble = MedianOf(samples_, &StepSample::bubble);
  return m;
}

std::optional<v1::PlanCheck> MakePlanCheck(const v1::Plan& plan, const StepTimeWindow& window,
                                           int64_t generation) {
  const std::optional<StepSample> median = window.Median();
  if (!median.has_value()) return std::nullopt;
  v1::PlanCheck check;
  check.set_predicted_step_seconds(plan.step_seconds());
  check.set_measured_step_seconds(median->step);
  check.set_ratio(plan.step_seconds() > 0 ? median->step / plan.step_seconds() : 0.0);
  check.set_measured_steps(window.size());
  *check.mutable_predicted_phases() = plan.phases();
  v1::PlanPhases* measured = check.mutable_measured_phases();
  measured->set_forward(median->forward);
  measured->set_backward(median->backward);
  measured->set_optimizer(median->optimizer);
  measured->set_comm_exposed(median->comm_exposed);
  measured->set_bubble(median->bubble);
  check.set_measured_data_seconds(median->data);
  check.set_generation(generation);
  return check;
}

}  // namespace loom::jobs
