#include "server/metrics/server_metrics.h"

#include <algorithm>
#include <string>
#include <tuple>
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

// Raises `counter` to `total`, kept by the job manager. The scrape hook is a per-rank counter's
// only writer (and hooks never run concurrently), so this keeps the two equal.
void RaiseTo(metrics::Counter& counter, double total) {
  const double delta = total - counter.Value();
  if (delta > 0) counter.Increment(delta);
}

metrics::Labels WithKind(metrics::Labels labels, std::string_view kind) {
  labels.emplace_back("kind", std::string(kind));
  return labels;
}

}  // namespace

std::string_view PhaseLabel(std::string_view phase) {
  for (std::string_view known : kPhases) {
    if (phase == known) return known;
  }
  return "other";
}

std::string_view CommKindLabel(std::string_view kind) {
  for (std::string_view known : kCommKinds) {
    if (kind == known) return known;
  }
  return "other";
}

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

void ServerMetrics::RecordRpc(std::string_view method, int code, absl::Duration duration) {
  static_assert(std::size(kCodeNames) == std::tuple_size_v<decltype(RpcSeries::by_code)>);
  const size_t c = code >= 0 && code < static_cast<int>(std::size(kCodeNames)) ? code : 2;
  metrics::Counter* counter = nullptr;
  metrics::Histogram* histogram = nullptr;
  {
    absl::MutexLock lock(&rpc_mu_);
    auto it = rpc_series_.find(method);
    if (it == rpc_series_.end()) {
      it = rpc_series_.emplace(std::string(method), RpcSeries()).first;
      it->second.duration = &registry_->GetHistogram(
          "loom_rpc_duration_seconds",
          "Seconds from an RPC's start on loomd to its status being sent, by full method name "
          "(for a stream, how long it was open).",
          rpc_duration_buckets_, {{"method", std::string(method)}});
    }
    metrics::Counter*& by_code = it->second.by_code[c];
    if (by_code == nullptr) {
      by_code = &registry_->GetCounter(
          "loom_rpc_requests_total", "RPCs served, by full method name and status code.",
          {{"method", std::string(method)}, {"code", std::string(kCodeNames[c])}});
    }
    counter = by_code;
    histogram = it->second.duration;
  }
  counter->Increment();
  histogram->Observe(absl::ToDoubleSeconds(std::max(duration, absl::ZeroDuration())));
}

void ServerMetrics::ObserveSchedulingLatency(absl::Duration latency) {
  scheduling_latency_.Observe(absl::ToDoubleSeconds(latency));
}

void ServerMetrics::IncrementRestarts() { restarts_.Increment(); }

void ServerMetrics::SetScalingEfficiency(const std::string& job,
                                         const std::map<int, double>& by_devices) {
  constexpr char kName[] = "loom_scaling_efficiency_ratio";
  absl::MutexLock lock(&scaling_mu_);
  auto drop = [&](const std::string& name) {
    for (const std::string& devices : scaling_series_[name]) {
      registry_->RemoveSeries(kName, {{"job", name}, {"devices", devices}});
    }
    scaling_series_.erase(name);
    std::erase(scaling_order_, name);
  };
  drop(job);  // only the latest sweep of a job name is exported
  while (scaling_order_.size() >= kMaxScalingJobs) drop(scaling_order_.front());
  std::vector<std::string>& series = scaling_series_[job];
  for (const auto& [devices, efficiency] : by_devices) {
    const std::string label = std::to_string(devices);
    registry_
        ->GetGauge(kName,
                   "Scaling efficiency against linear of the latest finished scaling sweep of the "
                   "job name, per size: tokens/s over (devices / first size) x the first size's.",
                   {{"job", job}, {"devices", label}})
        .Set(efficiency);
    series.push_back(label);
  }
  scaling_order_.push_back(job);
}

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
  registry_
      ->GetGauge("loom_quarantined_gangs",
                 "Gangs that workers run and loomd does not know, left running for an operator.")
      .Set(snapshot.quarantined_gangs);
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
  std::set<std::pair<std::string, metrics::Labels>> exported;
  CollectJobStepTimes(snapshot.job_step_seconds, exported);
  CollectRanks(snapshot.ranks, exported);
  CollectDoctor(snapshot.doctor, exported);
  CollectGoodput(snapshot.goodput, exported);
  CollectProgress(snapshot.progress, exported);
  absl::MutexLock lock(&mu_);
  for (const auto& [name, labels] : job_series_) {
    if (!exported.contains({name, labels})) registry_->RemoveSeries(name, labels);
  }
  job_series_ = std::move(exported);
}

void ServerMetrics::CollectJobStepTimes(
    const std::map<std::string, JobStepTimes>& jobs,
    std::set<std::pair<std::string, metrics::Labels>>& exported) {
  constexpr char kPredicted[] = "loom_job_predicted_step_seconds";
  constexpr char kMeasured[] = "loom_job_step_seconds";
  for (const auto& [job, times] : jobs) {
    const metrics::Labels labels = {{"job", job}};
    if (times.predicted_seconds.has_value()) {
      registry_->GetGauge(kPredicted, "The planner's predicted seconds per optimizer step.", labels)
          .Set(*times.predicted_seconds);
      exported.insert({kPredicted, labels});
    }
    if (times.measured_seconds.has_value()) {
      registry_
          ->GetGauge(kMeasured,
                     "Measured seconds per optimizer step: the median of rank 0's recent steps, "
                     "warmup excluded.",
                     labels)
          .Set(*times.measured_seconds);
      exported.insert({kMeasured, labels});
    }
  }
}

void ServerMetrics::CollectDoctor(const std::map<std::string, JobDoctorTelemetry>& jobs,
                                  std::set<std::pair<std::string, metrics::Labels>>& exported) {
  constexpr char kFinding[] = "loom_job_finding";
  constexpr char kImbalance[] = "loom_job_stage_imbalance_ratio";
  constexpr char kStraggler[] = "loom_rank_straggler_score";
  for (const auto& [job, doctor] : jobs) {
    for (const auto& [key, count] : doctor.findings) {
      const metrics::Labels labels = {{"job", job}, {"kind", key.first}, {"severity", key.second}};
      registry_
          ->GetGauge(kFinding, "The doctor's raised findings of the job, by kind and severity.",
                     labels)
          .Set(count);
      exported.insert({kFinding, labels});
    }
    if (doctor.stage_imbalance_ratio.has_value()) {
      const metrics::Labels labels = {{"job", job}};
      registry_
          ->GetGauge(kImbalance,
                     "The busiest pipeline stage's busy time over the mean over stages.", labels)
          .Set(*doctor.stage_imbalance_ratio);
      exported.insert({kImbalance, labels});
    }
    for (const auto& [rank, score] : doctor.straggler_scores) {
      const metrics::Labels labels = {{"job", job}, {"rank", std::to_string(rank)}};
      registry_
          ->GetGauge(kStraggler,
                     "Median busy time of the rank's data-parallel peers at its position over its "
                     "own (below 1: slower than its peers).",
                     labels)
          .Set(score);
      exported.insert({kStraggler, labels});
    }
  }
}

void ServerMetrics::CollectGoodput(const std::map<std::string, JobGoodput>& jobs,
                                   std::set<std::pair<std::string, metrics::Labels>>& exported) {
  constexpr char kRatio[] = "loom_job_goodput_ratio";
  constexpr char kLost[] = "loom_job_lost_seconds";
  for (const auto& [job, goodput] : jobs) {
    const metrics::Labels labels = {{"job", job}};
    registry_
        ->GetGauge(kRatio,
                   "Productive training seconds (steps kept) over the wall seconds since the job "
                   "was submitted.",
                   labels)
        .Set(goodput.ratio);
    exported.insert({kRatio, labels});
    for (const auto& [reason, seconds] : goodput.lost_seconds) {
      const metrics::Labels l = {{"job", job}, {"reason", reason}};
      registry_
          ->GetGauge(kLost,
                     "Wall seconds of the job not spent in kept training steps, by reason "
                     "(queued, starting, checkpointing, restarts, rebalancing, other).",
                     l)
          .Set(seconds);
      exported.insert({kLost, l});
    }
  }
}

void ServerMetrics::CollectRanks(const std::map<std::string, std::map<int, RankTelemetry>>& ranks,
                                 std::set<std::pair<std::string, metrics::Labels>>& exported) {
  struct Ratio {
    const char* name;
    const char* help;
    std::optional<double> RankTelemetry::*value;
  };
  static constexpr Ratio kRatios[] = {
      {"loom_rank_idle_ratio",
       "Share of the rank's latest step spent on exposed communication and pipeline bubbles.",
       &RankTelemetry::idle_ratio},
      {"loom_rank_bubble_ratio",
       "Share of the rank's latest step spent waiting on pipeline neighbours.",
       &RankTelemetry::bubble_ratio},
      {"loom_rank_overlap_ratio",
       "Share of the rank's data-parallel communication time hidden behind compute in its latest "
       "step.",
       &RankTelemetry::overlap_ratio},
  };
  constexpr char kCommBytes[] = "loom_rank_comm_bytes_total";
  for (const auto& [job, by_rank] : ranks) {
    for (const auto& [rank, telemetry] : by_rank) {
      const metrics::Labels labels = {{"job", job}, {"rank", std::to_string(rank)}};
      for (const Ratio& ratio : kRatios) {
        const std::optional<double>& value = telemetry.*ratio.value;
        if (!value.has_value()) continue;
        registry_->GetGauge(ratio.name, ratio.help, labels).Set(*value);
        exported.insert({ratio.name, labels});
      }
      for (const auto& [kind, total] : telemetry.comm_bytes_total) {
        metrics::Labels with_kind = WithKind(labels, CommKindLabel(kind));
        RaiseTo(registry_->GetCounter(
                    kCommBytes, "Bytes the rank moved through collectives, by collective kind.",
                    with_kind),
                total);
        exported.insert({kCommBytes, std::move(with_kind)});
      }
      CollectRankPhases(labels, telemetry, exported);
      if (telemetry.memory.has_value()) CollectRankMemory(labels, *telemetry.memory, exported);
      if (telemetry.device_allocations_total.has_value()) {
        constexpr char kDeviceAllocs[] = "loom_gpu_device_allocations_total";
        RaiseTo(registry_->GetCounter(kDeviceAllocs,
                                      "Device memory segments (cudaMalloc) the rank's caching "
                                      "allocator took; flat in an allocation-free steady state.",
                                      labels),
                *telemetry.device_allocations_total);
        exported.insert({kDeviceAllocs, labels});
      }
    }
  }
}

void ServerMetrics::CollectProgress(const std::map<std::string, JobProgressTelemetry>& jobs,
                                    std::set<std::pair<std::string, metrics::Labels>>& exported) {
  struct Gauge {
    const char* name;
    const char* help;
    std::optional<double> value;
  };
  for (const auto& [job, progress] : jobs) {
    const metrics::Labels labels = {{"job", job}};
    const Gauge gauges[] = {
        {"loom_job_step", "The job's latest optimizer step (its progress).",
         progress.step.has_value() ? std::optional<double>(static_cast<double>(*progress.step))
                                   : std::nullopt},
        {"loom_job_loss", "The job's latest training loss (its progress).", progress.loss},
        {"loom_job_tokens_per_second", "Training tokens per second over the whole job.",
         progress.tokens_per_second},
        {"loom_job_last_step_timestamp_seconds",
         "Unix time at which loomd received rank 0's latest step (or evaluation) report.",
         progress.last_step_unix_seconds},
        {"loom_job_mfu_ratio",
         "Measured model FLOPs utilisation: the plan's MFU times predicted over measured step "
         "time.",
         progress.mfu},
        {"loom_job_restarts", "Gang restarts of the job so far.",
         static_cast<double>(progress.restarts)},
    };
    for (const Gauge& g : gauges) {
      if (!g.value.has_value()) continue;
      registry_->GetGauge(g.name, g.help, labels).Set(*g.value);
      exported.insert({g.name, labels});
    }
  }
}

void ServerMetrics::CollectRankPhases(const metrics::Labels& labels, const RankTelemetry& telemetry,
                                      std::set<std::pair<std::string, metrics::Labels>>& exported) {
  constexpr char kPhaseSeconds[] = "loom_rank_phase_seconds_total";
  for (const auto& [phase, seconds] : telemetry.phase_seconds_total) {
    metrics::Labels with_phase = labels;
    with_phase.emplace_back("phase", phase);
    RaiseTo(registry_->GetCounter(kPhaseSeconds,
                                  "Seconds of the rank's steps by phase (forward, backward, "
                                  "optimizer, comm_exposed, bubble, data).",
                                  with_phase),
            seconds);
    exported.insert({kPhaseSeconds, std::move(with_phase)});
  }
  if (telemetry.step_seconds.has_value()) {
    constexpr char kStep[] = "loom_rank_step_seconds";
    registry_->GetGauge(kStep, "Seconds of the rank's latest step.", labels)
        .Set(*telemetry.step_seconds);
    exported.insert({kStep, labels});
  }
  if (telemetry.device_memory_bytes.has_value()) {
    constexpr char kDeviceMemory[] = "loom_rank_device_memory_bytes";
    registry_
        ->GetGauge(kDeviceMemory,
                   "Memory of the device the rank runs on (its worker's inventory): the limit of "
                   "the rank's memory gauges.",
                   labels)
        .Set(static_cast<double>(*telemetry.device_memory_bytes));
    exported.insert({kDeviceMemory, labels});
  }
}

void ServerMetrics::CollectRankMemory(const metrics::Labels& labels, const RankMemory& memory,
                                      std::set<std::pair<std::string, metrics::Labels>>& exported) {
  auto set = [&](const char* name, const char* help, metrics::Labels series, double value) {
    registry_->GetGauge(name, help, series).Set(value);
    exported.insert({name, std::move(series)});
  };
  constexpr char kRankMemory[] = "loom_rank_memory_bytes";
  constexpr char kRankMemoryHelp[] =
      "The rank's memory in its latest step: kind allocated (by the training core), peak "
      "(allocated, at most so far), rss (resident set of the process).";
  set(kRankMemory, kRankMemoryHelp, WithKind(labels, "allocated"),
      static_cast<double>(memory.allocated));
  set(kRankMemory, kRankMemoryHelp, WithKind(labels, "peak"), static_cast<double>(memory.peak));
  set(kRankMemory, kRankMemoryHelp, WithKind(labels, "rss"), static_cast<double>(memory.rss));
  if (!memory.gpu_reserved.has_value()) return;  // not on a GPU
  constexpr char kGpuMemory[] = "loom_gpu_memory_bytes";
  constexpr char kGpuMemoryHelp[] =
      "Device memory of the rank in its latest step: kind allocated (in use), reserved (held by "
      "the caching allocator, in use + cached, plus fixed buffers), peak (in use, at most so "
      "far).";
  set(kGpuMemory, kGpuMemoryHelp, WithKind(labels, "allocated"),
      static_cast<double>(memory.allocated));
  set(kGpuMemory, kGpuMemoryHelp, WithKind(labels, "reserved"),
      static_cast<double>(*memory.gpu_reserved));
  set(kGpuMemory, kGpuMemoryHelp, WithKind(labels, "peak"), static_cast<double>(memory.peak));
  if (memory.gpu_fragmentation.has_value()) {
    set("loom_gpu_memory_fragmentation_ratio",
        "1 - the largest free cached block / the free cached bytes of the rank's caching "
        "allocator in its latest step (0: one free block; near 1: scattered).",
        labels, *memory.gpu_fragmentation);
  }
}

}  // namespace loom::server_metrics
