#include "server/scaling/attribution.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/doctor/stats.h"

namespace loom::scaling {
namespace {

double Busy(const v1::ScaleRankPhases& r) {
  return r.forward() + r.backward() + r.optimizer() + r.data();
}

void AddEvidence(v1::Finding* f, const std::string& name, double value, const std::string& series) {
  v1::FindingEvidence* e = f->add_evidence();
  e->set_name(name);
  e->set_value(value);
  e->set_series(series);
}

}  // namespace

absl::Status MeasurePoint(const doctor::TelemetryWindow& window, int world_size,
                          int64_t warmup_steps, v1::ScalePoint* point) {
  point->clear_ranks();
  auto measured = [&](const doctor::RankStep& s) { return s.step > warmup_steps && s.has_phases; };
  // The steps kept, by rank 0's step time: an outlier step (a hiccup of the host) is dropped for
  // every rank, so that the ranks' means stay over the same steps.
  std::set<int64_t> kept;
  {
    const auto rank0 = window.ranks().find(0);
    std::vector<double> times;
    if (rank0 != window.ranks().end()) {
      for (const doctor::RankStep& s : rank0->second.steps) {
        if (measured(s)) times.push_back(s.step_seconds);
      }
    }
    const double median = doctor::Median(times);
    const double limit = median + std::max(kOutlierMads * doctor::Mad(times), 0.05 * median);
    if (rank0 != window.ranks().end()) {
      for (const doctor::RankStep& s : rank0->second.steps) {
        if (measured(s) && s.step_seconds <= limit) kept.insert(s.step);
      }
    }
  }
  int min_steps = 0;
  for (int rank = 0; rank < world_size; ++rank) {
    const auto it = window.ranks().find(rank);
    double n = 0;
    v1::ScaleRankPhases sum;
    if (it != window.ranks().end()) {
      for (const doctor::RankStep& s : it->second.steps) {
        if (!measured(s) || !kept.contains(s.step)) continue;
        ++n;
        sum.set_step_seconds(sum.step_seconds() + s.step_seconds);
        sum.set_forward(sum.forward() + s.forward);
        sum.set_backward(sum.backward() + s.backward);
        sum.set_optimizer(sum.optimizer() + s.optimizer);
        sum.set_data(sum.data() + s.data);
        sum.set_comm_exposed(sum.comm_exposed() + s.comm_exposed);
        sum.set_bubble(sum.bubble() + s.bubble);
      }
    }
    if (n == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("at ", point->devices(), " devices rank ", rank,
                       " reported no step with phases after the ", warmup_steps,
                       " warm-up steps; raise --steps (the copy must run past its warm-up)"));
    }
    min_steps = rank == 0 ? static_cast<int>(n) : std::min(min_steps, static_cast<int>(n));
    v1::ScaleRankPhases* r = point->add_ranks();
    r->set_rank(rank);
    r->set_step_seconds(sum.step_seconds() / n);
    r->set_forward(sum.forward() / n);
    r->set_backward(sum.backward() / n);
    r->set_optimizer(sum.optimizer() / n);
    r->set_data(sum.data() / n);
    r->set_comm_exposed(sum.comm_exposed() / n);
    r->set_bubble(sum.bubble() / n);
  }
  const double step = point->ranks(0).step_seconds();
  point->set_measured_steps(min_steps);
  point->set_step_seconds(step);
  point->set_tokens_per_second(step > 0 ? point->global_batch_tokens() / step : 0);
  point->set_measured(true);
  return absl::OkStatus();
}

double Explained(const v1::ScalingLoss& loss) {
  return loss.comm_exposed() + loss.bubble() + loss.imbalance() + loss.rest();
}

void Attribute(v1::ScaleTest* sweep) {
  if (sweep->points_size() == 0 || !sweep->points(0).measured()) return;
  const v1::ScalePoint& first = sweep->points(0);
  if (first.step_seconds() <= 0 || first.global_batch_tokens() <= 0 || first.devices() <= 0) {
    return;
  }
  double first_busy = 0;
  for (const v1::ScaleRankPhases& r : first.ranks()) first_busy += Busy(r);
  if (first.ranks_size() > 0) first_busy /= first.ranks_size();

  for (v1::ScalePoint& p : *sweep->mutable_points()) {
    if (!p.measured() || p.ranks_size() == 0 || p.step_seconds() <= 0) continue;
    // The work per device relative to the first size.
    const double work = (static_cast<double>(p.global_batch_tokens()) /
                         static_cast<double>(first.global_batch_tokens())) *
                        (static_cast<double>(first.devices()) / static_cast<double>(p.devices()));
    const double ideal = first.step_seconds() * work;
    p.set_ideal_step_seconds(ideal);
    p.set_efficiency(ideal / p.step_seconds());

    // The critical path: the rank with the most work of its own. Every other rank waits for it
    // inside its exposed communication (data parallel) or its bubble (pipeline); that wait is
    // the imbalance bucket, so only the critical rank's own comm and bubble are counted.
    const v1::ScaleRankPhases* critical = &p.ranks(0);
    double busy_sum = 0;
    for (const v1::ScaleRankPhases& r : p.ranks()) {
      busy_sum += Busy(r);
      if (Busy(r) > Busy(*critical)) critical = &r;
    }
    const double busy_mean = busy_sum / p.ranks_size();
    v1::ScalingLoss* loss = p.mutable_loss();
    loss->set_lost_seconds(p.step_seconds() - ideal);
    loss->set_critical_rank(critical->rank());
    loss->set_comm_exposed(critical->comm_exposed());
    loss->set_bubble(critical->bubble());
    loss->set_imbalance(Busy(*critical) - busy_mean);
    loss->set_rest(busy_mean - first_busy * work);
    loss->set_unexplained(loss->lost_seconds() - Explained(*loss));
  }
}

std::vector<v1::Finding> ScalingFindings(const v1::ScaleTest& sweep, double threshold) {
  std::vector<v1::Finding> out;
  for (const v1::ScalePoint& p : sweep.points()) {
    if (!p.measured() || p.efficiency() <= 0 || p.efficiency() >= threshold) continue;
    const v1::ScalingLoss& loss = p.loss();
    // The largest measured bucket names the fix.
    const std::pair<double, std::string> buckets[] = {
        {loss.comm_exposed(), "exposed communication"},
        {loss.bubble(), "pipeline bubble"},
        {loss.imbalance(), "imbalance"},
        {loss.rest(), "compute inflation"},
    };
    const auto* top =
        std::max_element(std::begin(buckets), std::end(buckets),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    v1::Finding f;
    f.set_kind(v1::SCALING);
    f.set_severity(p.efficiency() < kCriticalEfficiency ? v1::FINDING_SEVERITY_CRITICAL
                                                        : v1::FINDING_SEVERITY_WARNING);
    f.set_subject(absl::StrCat(p.devices(), " devices"));
    f.set_rank(-1);
    f.set_stage(-1);
    const double lost = std::max(loss.lost_seconds(), 1e-12);
    f.set_summary(absl::StrFormat(
        "scaling efficiency %.2f at %d devices (under %.2f): %.1f%% of the step is lost against "
        "linear, most of it to %s (%.0f%% of the loss)",
        p.efficiency(), p.devices(), threshold, 100 * loss.lost_seconds() / p.step_seconds(),
        top->second, 100 * top->first / lost));
    AddEvidence(&f, "efficiency", p.efficiency(), "loom_scaling_efficiency_ratio");
    AddEvidence(&f, "step_seconds", p.step_seconds(), "StepReport.step_seconds (rank 0)");
    AddEvidence(&f, "ideal_step_seconds", p.ideal_step_seconds(), "first size's step x work");
    AddEvidence(&f, "lost_seconds", loss.lost_seconds(), "step - ideal");
    AddEvidence(&f, "comm_exposed_seconds", loss.comm_exposed(),
                "StepReport.phase_seconds[comm_exposed]");
    AddEvidence(&f, "bubble_seconds", loss.bubble(), "StepReport.phase_seconds[bubble]");
    AddEvidence(&f, "imbalance_seconds", loss.imbalance(), "max - mean busy over ranks");
    AddEvidence(&f, "compute_inflation_seconds", loss.rest(), "mean busy - ideal busy");
    AddEvidence(&f, "unexplained_seconds", loss.unexplained(), "lost - the buckets");
    std::string fix;
    if (top == &buckets[0]) {
      fix =
          "overlap the gradient all-reduce with backward (overlap on) with smaller buckets, or "
          "fewer data-parallel replicas with more micro-batches; keep traffic inside a node "
          "(loomctl plan)";
    } else if (top == &buckets[1]) {
      fix =
          "fewer pipeline stages (parallelism.pipeline) or more micro-batches per step (a smaller "
          "parallelism.micro_batch), so the fill and drain weigh less";
    } else if (top == &buckets[2]) {
      fix =
          "even out the ranks: re-split the stages (rebalance: {mode: auto}, or the "
          "blocks_per_stage of loomctl doctor's STAGE_IMBALANCE) or move a STRAGGLER's node out";
    } else {
      fix =
          "each device computes slower than alone: the devices share cores or memory bandwidth "
          "(on CPU devices, fewer devices per node or OMP_NUM_THREADS per rank), or the per-device "
          "batch is too small to be efficient (try --weak, or a larger global_batch_tokens)";
    }
    f.set_fix(fix);
    f.set_predicted_gain(std::clamp(top->first / p.step_seconds(), 0.0, 0.99));
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace loom::scaling
