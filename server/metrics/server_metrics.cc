#include "server/metrics/server_metrics.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"

namespace loom::server_metrics {
namespace {

constexpr std::string_view kCodeNames[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

constexpr v1::JobState kJobStates[] = {v1::QUEUED, v1::SCHEDULED, v1::RUNNING,   v1::SUCCEEDED,
                                       v1::FAILED, v1::CANCELLED, v1::RESTARTING};

}  // namespace

ServerMetrics::ServerMetrics(metrics::Registry* registry)
    : registry_(registry),
      scheduling_latency_(registry->GetHistogram(
          "loom_scheduling_latency_seconds",
          "Time from a job being ready to schedule (QUEUED, or RESTARTING after its backoff) to "
          "SCHEDULED.",
          metrics::ExponentialBuckets(0.001, 4, 10))),
      restarts_(registry->GetCounter("loom_job_restarts_total",
                                     "Gang restarts after retryable failures.")) {
  registry_->AddCollectHook([this] { Collect(); });
}

void ServerMetrics::SetSnapshotSource(std::function<Snapshot()> source) {
  absl::MutexLock lock(&mu_);
  source_ = std::move(source);
}

std::string_view ServerMetrics::CodeName(int code) {
  if (code < 0 || code >= static_cast<int>(std::size(kCodeNames))) return "UNKNOWN";
  return kCodeNames[code];
}

void ServerMetrics::RecordRpc(std::string_view method, std::string_view code) {
  registry_
      ->GetCounter("loom_rpc_requests_total", "RPCs served, by full method name and status code.",
                   {{"method", std::string(method)}, {"code", std::string(code)}})
      .Increment();
}

void ServerMetrics::ObserveSchedulingLatency(absl::Duration latency) {
  scheduling_latency_.Observe(absl::ToDoubleSeconds(latency));
}

void ServerMetrics::IncrementRestarts() { restarts_.Increment(); }

void ServerMetrics::Collect() {
  std::function<Snapshot()> source;
  {
    absl::MutexLock lock(&mu_);
    source = source_;
  }
  Snapshot snapshot = source ? source() : Snapshot{};
  for (v1::JobState state : kJobStates) {
    auto it = snapshot.jobs.find(state);
    registry_->GetGauge("loom_jobs", "Jobs by state.", {{"state", v1::JobState_Name(state)}})
        .Set(it == snapshot.jobs.end() ? 0 : it->second);
  }
  registry_->GetGauge("loom_scheduler_queue_depth", "Jobs waiting for devices.")
      .Set(snapshot.queue_depth);
  for (v1::NodeState state : {v1::NODE_STATE_READY, v1::NODE_STATE_LOST}) {
    auto it = snapshot.nodes.find(state);
    std::string label(v1::NodeState_Name(state).substr(std::string_view("NODE_STATE_").size()));
    registry_->GetGauge("loom_nodes", "Nodes by state.", {{"state", label}})
        .Set(it == snapshot.nodes.end() ? 0 : it->second);
  }
  for (const char* kind : {"gpu", "cpu"}) {
    auto it = snapshot.devices.find(kind);
    const auto [total, allocated] = it == snapshot.devices.end() ? std::pair{0, 0} : it->second;
    registry_
        ->GetGauge("loom_devices", "Devices on READY nodes, by kind; state total|allocated.",
                   {{"kind", kind}, {"state", "total"}})
        .Set(total);
    registry_
        ->GetGauge("loom_devices", "Devices on READY nodes, by kind; state total|allocated.",
                   {{"kind", kind}, {"state", "allocated"}})
        .Set(allocated);
  }
  CollectJobStepTimes(snapshot.job_step_seconds);
}

void ServerMetrics::CollectJobStepTimes(const std::map<std::string, JobStepTimes>& jobs) {
  constexpr char kPredicted[] = "loom_job_predicted_step_seconds";
  constexpr char kMeasured[] = "loom_job_step_seconds";
  std::set<std::pair<std::string, std::string>> exported;
  for (const auto& [job, times] : jobs) {
    if (times.predicted_seconds.has_value()) {
      registry_
          ->GetGauge(kPredicted, "The planner's predicted seconds per optimizer step.",
                     {{"job", job}})
          .Set(*times.predicted_seconds);
      exported.insert({kPredicted, job});
    }
    if (times.measured_seconds.has_value()) {
      registry_
          ->GetGauge(kMeasured,
                     "Measured seconds per optimizer step: the median of rank 0's recent steps, "
                     "warmup excluded.",
                     {{"job", job}})
          .Set(*times.measured_seconds);
      exported.insert({kMeasured, job});
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [name, job] : job_series_) {
    if (!exported.contains({name, job})) registry_->RemoveSeries(name, {{"job", job}});
  }
  job_series_ = std::move(exported);
}

}  // namespace loom::server_metrics
