// The JobManager's doctor (issue 12, part 3): on the tick, each running job whose rank 0 moved
// kDoctorWindowSteps steps since the last window is judged by the doctor's pure rules
// (server/doctor/rules.h) over its telemetry window; the finding tracker decides what is raised
// and cleared, and those become job events carrying the finding. GetJobReport serves the last
// report; MetricsSnapshot exports it (loom_job_finding, loom_job_stage_imbalance_ratio,
// loom_rank_straggler_score).
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "server/doctor/rules.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_helpers.h"
#include "server/jobs/model_presets.h"
#include "server/planner_service/plan_mapping.h"

namespace loom::jobs {
namespace {

doctor::LayoutInfo LayoutOf(const v1::Job& job) {
  doctor::LayoutInfo l;
  const v1::Layout& layout = job.layout();
  l.data = std::max(1, layout.data());
  l.tensor = std::max(1, layout.tensor());
  l.pipeline = std::max(1, layout.pipeline());
  l.micro_batch = layout.micro_batch();
  l.num_micro_batches = layout.num_micro_batches();
  l.zero1 = layout.zero1();
  const v1::ParallelismSpec& p = job.spec().parallelism();
  if (p.has_dp_bucket_mb()) l.dp_bucket_mb = p.dp_bucket_mb();
  if (p.has_dp_overlap()) l.dp_overlap = p.dp_overlap();
  l.blocks_per_stage.assign(layout.blocks_per_stage().begin(), layout.blocks_per_stage().end());
  if (l.blocks_per_stage.empty()) {
    const auto& spec = job.spec().parallelism().blocks_per_stage();
    l.blocks_per_stage.assign(spec.begin(), spec.end());
  }
  l.layers = job.spec().model().layers();
  if (l.layers <= 0) {
    if (auto dims = FindModelPreset(job.spec().model().preset()); dims.has_value()) {
      l.layers = dims->layers;
    }
  }
  return l;
}

std::string EventText(const v1::Finding& f, bool raised) {
  std::string text = absl::StrCat("doctor: ", raised ? "raised " : "cleared ",
                                  doctor::KindName(f.kind()), " (", f.subject(), ")");
  if (raised && !f.summary().empty()) absl::StrAppend(&text, ": ", f.summary());
  if (raised && !f.fix().empty()) absl::StrAppend(&text, "; fix: ", f.fix());
  return text;
}

}  // namespace

void JobManager::PlanDoctorAdviceLocked(ActiveJob& active) {
  active.doctor_planned = true;
  const doctor::LayoutInfo l = LayoutOf(active.job);
  const std::vector<v1::Node> nodes = nodes_.List();
  const planner_service::CalibrationByModel calibration =
      calibrator_ != nullptr ? calibrator_->Applicable() : planner_service::CalibrationByModel();
  // The running layout as constraints: the planner evaluates it (`constrained`) beside the best
  // layouts for the same model and devices (`plans`).
  auto plan = [&](int micro_batch) -> std::optional<v1::PlanJobResponse> {
    v1::PlanJobRequest request;
    *request.mutable_spec() = active.job.spec();
    v1::ParallelismSpec* p = request.mutable_spec()->mutable_parallelism();
    p->clear_auto_();
    p->set_data(l.data);
    p->set_tensor(l.tensor);
    p->set_pipeline(l.pipeline);
    p->set_micro_batch(micro_batch);
    request.set_top_k(1);
    absl::StatusOr<v1::PlanJobResponse> r = planner_service::PlanJob(request, nodes, calibration);
    if (!r.ok() || !r->has_constrained()) return std::nullopt;
    return *std::move(r);
  };
  if (l.micro_batch <= 0) return;
  std::optional<v1::PlanJobResponse> now = plan(l.micro_batch);
  if (!now.has_value()) return;
  const v1::Plan& current = now->constrained();
  if (now->plans_size() > 0 && current.step_seconds() > 0) {
    doctor::LayoutAdvice advice;
    advice.best = now->plans(0).layout();
    advice.best_predicted_step_seconds = now->plans(0).step_seconds();
    advice.current_predicted_step_seconds = current.step_seconds();
    active.doctor_layout = advice;
  }
  active.doctor_device_memory = current.memory().device();
  active.doctor_fits.push_back({l.micro_batch, current.memory().total()});
  for (int k : {2 * l.micro_batch, 4 * l.micro_batch, 8 * l.micro_batch}) {
    std::optional<v1::PlanJobResponse> larger = plan(k);
    if (!larger.has_value()) break;  // the batch does not divide, or it does not fit at all
    active.doctor_fits.push_back({k, larger->constrained().memory().total()});
  }
}

void JobManager::RunDoctorLocked(ActiveJob& active) {
  const int64_t newest = active.doctor_window.newest_step();
  if (newest < 0 || newest < active.doctor_step + kDoctorWindowSteps) return;

  doctor::DoctorInput input;
  input.layout = LayoutOf(active.job);
  input.window = &active.doctor_window;
  for (const v1::Placement& p : active.job.placements()) {
    for (int rank : p.ranks()) input.rank_nodes[rank] = p.node();
    const nodes::NodeEntry* node = nodes_.Find(p.node());
    if (active.kind == v1::DEVICE_KIND_CPU && node != nullptr) {
      input.node_cpu_cores[p.node()] = node->node.cpu_cores();
    }
  }
  input.raised = active.doctor_state.RaisedKeys();
  if (!active.doctor_planned && active.doctor_window.newest_step() >= 0) {
    PlanDoctorAdviceLocked(active);
  }
  input.layout_advice = active.doctor_layout;
  input.device_memory_bytes = active.doctor_device_memory;
  input.micro_batch_fits = active.doctor_fits;
  doctor::Diagnosis diagnosis = doctor::Diagnose(input);
  if (!diagnosis.judged) return;  // not a window: too few steps yet, try again next tick
  active.doctor_step = newest;
  if (active.job.spec().rebalance().mode() == "off") {
    for (v1::Finding& f : diagnosis.findings) {
      if (f.kind() != v1::STAGE_IMBALANCE) continue;
      f.clear_blocks_per_stage();
      f.set_predicted_gain(0);
      f.set_predicted_step_seconds(0);
      f.set_fix("re-splitting is off (spec.rebalance.mode); set it to suggest or auto");
    }
  }

  doctor::TrackerUpdate update = doctor::Track(std::move(active.doctor_state), diagnosis.findings);
  active.doctor_state = std::move(update.state);

  v1::JobReport& report = active.doctor_report;
  report.Clear();
  report.set_job(active.job.name());
  report.set_generation(active.job.generation());
  report.set_windows(active.doctor_state.windows);
  *report.mutable_evaluate_time() = internal::ToProto(clock_->Now());
  report.set_step_seconds(diagnosis.step_seconds);
  for (const auto& [key, entry] : active.doctor_state.entries) {
    *(entry.raised ? report.add_findings() : report.add_pending()) = entry.finding;
  }
  for (const v1::StageReport& s : diagnosis.stages) *report.add_stages() = s;
  for (const v1::RankReport& r : diagnosis.ranks) *report.add_ranks() = r;

  for (auto [list, raised] : {std::pair{&update.raised, true}, std::pair{&update.cleared, false}}) {
    for (const v1::Finding& f : *list) {
      v1::JobEvent event;
      *event.mutable_time() = internal::ToProto(clock_->Now());
      event.set_from_state(active.job.state());
      event.set_to_state(active.job.state());
      event.set_reason(EventText(f, raised));
      event.set_generation(active.job.generation());
      *event.mutable_finding() = f;
      event.set_finding_raised(raised);
      LOOM_LOG(INFO) << active.job.name() << ": " << event.reason();
      absl::Status s = CommitLocked(active, active.job, event);
      if (!s.ok()) {
        LOOM_LOG(WARNING) << "cannot record a doctor event of " << active.job.name() << ": " << s;
      }
    }
  }
  if (active.job.spec().rebalance().mode() == "auto") RebalanceLocked(active, diagnosis);
}

bool JobManager::RebalanceLocked(ActiveJob& active, const doctor::Diagnosis& diagnosis) {
  ActiveJob::Rebalance& rb = active.rebalance;
  auto idle = [&diagnosis] {
    std::vector<std::string> parts;
    for (const v1::StageReport& s : diagnosis.stages) {
      parts.push_back(absl::StrFormat("%.2f", s.idle_ratio()));
    }
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  };
  auto apply = [&](const std::vector<int>& split, const std::string& what) {
    v1::Layout previous = active.job.layout();
    active.job.mutable_layout()->mutable_blocks_per_stage()->Assign(split.begin(), split.end());
    // The gang saves at a step its ranks agree on before it stops (nothing since the last
    // periodic checkpoint is lost) and is placed again once every rank has exited.
    active.requeue_cause = doctor::WaitCause::kRebalance;  // for the goodput accounting
    RequeueGangLocked(active, what, options_.drain_requeue_delay, /*checkpoint=*/true);
    active.requeue_cause = doctor::WaitCause::kRestart;
    if (active.job.state() != v1::RESTARTING) *active.job.mutable_layout() = previous;  // refused
  };
  if (rb.measuring) {
    if (active.doctor_state.windows < kRebalanceVerifyWindows) return false;
    rb.measuring = false;
    const double after = diagnosis.step_seconds;
    const double gain = rb.before_step > 0 ? 1.0 - after / rb.before_step : 0.0;
    const double predicted = rb.before_step > 0 ? 1.0 - rb.predicted_step / rb.before_step : 0.0;
    const bool pays = gain >= kRebalanceMinGain;
    AddNoticeLocked(
        active,
        absl::StrFormat("doctor: rebalance verified: step %.4f s with blocks_per_stage [%s] "
                        "against %.4f s with [%s] (%+.1f%%; predicted %+.1f%%); stage idle "
                        "ratios %s before, %s after%s",
                        after, absl::StrJoin(rb.after, ", "), rb.before_step,
                        absl::StrJoin(rb.before, ", "), -gain * 100, -predicted * 100,
                        rb.before_idle, idle(), pays ? "" : "; it does not pay: rolling back"));
    if (pays) return false;
    rb.changes = kMaxRebalances;  // a change that did not pay is not tried again
    apply(rb.before, absl::StrCat("doctor: rebalance rolled back to blocks_per_stage [",
                                  absl::StrJoin(rb.before, ", "), "]"));
    return true;
  }
  if (rb.changes >= kMaxRebalances) return false;
  const int stages = std::max(1, active.job.layout().pipeline());
  for (const auto& [key, entry] : active.doctor_state.entries) {
    const v1::Finding& f = entry.finding;
    if (!entry.raised || f.kind() != v1::STAGE_IMBALANCE || f.blocks_per_stage_size() != stages) {
      continue;
    }
    rb.before = LayoutOf(active.job).blocks_per_stage;
    if (static_cast<int>(rb.before.size()) != stages) {
      rb.before = doctor::EvenSplit(LayoutOf(active.job).layers, stages);
    }
    rb.after.assign(f.blocks_per_stage().begin(), f.blocks_per_stage().end());
    if (rb.after == rb.before) return false;
    rb.before_step = diagnosis.step_seconds;
    rb.predicted_step = f.predicted_step_seconds();
    rb.before_idle = idle();
    rb.measuring = true;
    ++rb.changes;
    apply(rb.after,
          absl::StrFormat("doctor: rebalance %d of at most %d: blocks_per_stage [%s] -> [%s], "
                          "predicted step %.4f s instead of %.4f s; resuming from the last "
                          "checkpoint",
                          rb.changes, kMaxRebalances, absl::StrJoin(rb.before, ", "),
                          absl::StrJoin(rb.after, ", "), rb.predicted_step, rb.before_step));
    if (active.job.state() != v1::RESTARTING) rb.measuring = false;
    return true;
  }
  return false;
}

absl::StatusOr<v1::JobReport> JobManager::GetJobReport(std::string_view name) {
  absl::StatusOr<v1::Job> job = GetJob(name);  // validates the name, NOT_FOUND when unknown
  if (!job.ok()) return job.status();
  absl::MutexLock lock(&mu_);
  v1::JobReport report;
  auto it = active_.find(name);
  if (it == active_.end()) {
    report.set_job(job->name());
    report.set_generation(job->generation());
    report.set_note(absl::StrCat("the job is ", v1::JobState_Name(job->state()),
                                 ": the doctor judges running jobs only"));
    *report.mutable_goodput() = job->goodput();  // final, as written at the end
    return report;
  }
  const ActiveJob& active = *it->second;
  const v1::Goodput goodput = active.goodput.Snapshot(clock_->Now());
  if (active.doctor_report.windows() == 0) {
    report.set_job(active.job.name());
    report.set_generation(active.job.generation());
    report.set_note(active.job.state() == v1::RUNNING
                        ? absl::StrCat("waiting for steps: the doctor judges a job once each rank "
                                       "has reported ",
                                       doctor::kMinSteps, " steps after its warmup")
                        : absl::StrCat("the job is ", v1::JobState_Name(active.job.state()),
                                       ": the doctor judges running jobs only"));
    *report.mutable_goodput() = goodput;
    return report;
  }
  report = active.doctor_report;
  *report.mutable_goodput() = goodput;
  return report;
}

}  // namespace loom::jobs
