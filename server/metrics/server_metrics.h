// ServerMetrics: loomd's Prometheus series, in one place so their names, labels and buckets are
// fixed by the program (never by input) and documented together:
//   loom_jobs{state}                          gauge, jobs per state (every job in the store)
//   loom_scheduler_queue_depth                gauge, jobs waiting for devices (QUEUED, and
//                                             RESTARTING whose backoff has expired)
//   loom_nodes{state}                         gauge, nodes per state (READY, LOST)
//   loom_quarantined_gangs                    gauge, gangs that workers run and loomd does not
//                                             know, left running after loomd started fresh
//                                             (--start-fresh) until an operator decides
//   loom_devices{kind, state}                 gauge, kind gpu|cpu, state total|allocated
//   loom_scheduling_latency_seconds           histogram, from ready-to-schedule to SCHEDULED
//   loom_rpc_requests_total{method, code}     counter, by full gRPC method and status code name
//   loom_rpc_duration_seconds{method}         histogram, from the call's start on loomd to its
//                                             status being sent (for a stream: how long it was
//                                             open), by full gRPC method: the control plane's
//                                             latency as users see it, e.g. CreateJob's p99
//   loom_job_restarts_total                   counter, gang restarts (entries into RESTARTING)
//   loom_job_predicted_step_seconds{job}      gauge, the plan's predicted seconds per step
//   loom_job_step_seconds{job}                gauge, the measured median seconds per step of
//                                             rank 0 (warmup excluded)
//   loom_rank_idle_ratio{job, rank}           gauge, (exposed communication + bubble) / step time
//   loom_rank_bubble_ratio{job, rank}         gauge, pipeline wait / step time
//   loom_rank_overlap_ratio{job, rank}        gauge, 1 - exposed / total data-parallel comm time
//                                             (all three from the rank's latest step report of
//                                             the current generation)
//   loom_rank_comm_bytes_total{job, rank, kind}
//                                             counter, bytes the rank moved per collective kind
//                                             (kCommKinds, anything else counted as "other")
//   loom_rank_memory_bytes{job, rank, kind}   gauge, kind allocated|peak|rss: the training
//                                             core's allocated bytes, their peak so far, and the
//                                             process's resident set (every rank)
//   loom_gpu_memory_bytes{job, rank, kind}    gauge, kind allocated|reserved|peak: device memory
//                                             in use, held by the caching allocator (in use +
//                                             cached), and the peak in use
//   loom_gpu_memory_fragmentation_ratio{job, rank}
//                                             gauge, 1 - largest free cached block / free cached
//                                             bytes
//                                             (the memory gauges: from the rank's latest step
//                                             report of the current generation; loom_gpu_* only
//                                             for ranks whose StepReport.device starts "cuda")
//   loom_gpu_device_allocations_total{job, rank}
//                                             counter, device memory segments (cudaMalloc) the
//                                             rank took; flat once the steady state is reached
//   loom_job_finding{job, kind, severity}    gauge, the doctor's raised findings of the job by
//                                             kind (STAGE_IMBALANCE, STRAGGLER, ...) and
//                                             severity (info|warning|critical); a series exists
//                                             only while such a finding is raised
//   loom_job_stage_imbalance_ratio{job}       gauge, the busiest pipeline stage's busy time over
//                                             the mean over stages (pipeline jobs the doctor
//                                             has judged)
//   loom_rank_straggler_score{job, rank}      gauge, the median busy time of the rank's
//                                             data-parallel peers at the same (stage, tensor)
//                                             position over its own (below 1: slower; 1 without
//                                             peers)
//   loom_job_step{job}                        gauge, the job's latest step (Job.progress)
//   loom_job_loss{job}                        gauge, the job's latest training loss
//   loom_job_tokens_per_second{job}           gauge, training tokens per second over the job
//                                             (Job.progress; evaluations leave these alone)
//   loom_job_last_step_timestamp_seconds{job} gauge, Unix time at which loomd received rank 0's
//                                             latest step (or evaluation) report (a stall
//                                             shows as an age)
//   loom_job_mfu_ratio{job}                   gauge, measured model FLOPs utilisation: the
//                                             plan's MFU scaled by predicted over measured
//                                             step time (the model FLOPs per step are fixed,
//                                             so MFU is inversely proportional to step time)
//   loom_job_restarts{job}                    gauge, gang restarts of the job so far
//   loom_rank_phase_seconds_total{job, rank, phase}
//                                             counter, seconds of the rank's steps by phase
//                                             (kPhases: forward, backward, optimizer,
//                                             comm_exposed, bubble, data; anything else "other")
//   loom_rank_step_seconds{job, rank}         gauge, the rank's latest step time
//   loom_rank_device_memory_bytes{job, rank}  gauge, the memory of the device the rank runs on
//                                             (from its worker's inventory), the limit its
//                                             memory gauges are compared with
//   loom_scaling_efficiency_ratio{job, devices}
//                                             gauge, the scaling efficiency against linear of the
//                                             latest finished sweep of each job name (the spec's
//                                             name, "TENANT/name" outside the default tenant:
//                                             ScalingMetricJob), per size; set when a sweep
//                                             finishes, at most kMaxScalingJobs job names (the
//                                             least recently set dropped)
// The per-job and per-rank series carry the job id (bounded by the active jobs) and the rank
// (bounded by the world size) and are removed at the first scrape after the job ends, so label
// sets do not accumulate.
//
// The gauges are refreshed from live state by a collect hook just before each scrape, so the
// managers never have to keep them in step by hand.
//
// Threading: thread-safe (metrics are atomics; the rpc counter cache has its own lock).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::server_metrics {

// Predicted and measured seconds per step of one active job; unset when not known.
struct JobStepTimes {
  std::optional<double> predicted_seconds;
  std::optional<double> measured_seconds;
};

// The collective kinds of StepReport.comm_bytes (docs/rank-contract.md).
inline constexpr std::string_view kCommKinds[] = {"all_reduce",   "tp_all_reduce",
                                                  "pp_send_recv", "emb_all_reduce",
                                                  "all_gather",   "world_all_reduce"};

// The label value for a comm_bytes kind from the wire: itself when known, else "other", so a
// worker cannot create unbounded label values.
std::string_view CommKindLabel(std::string_view kind);

// The step phases of StepReport.phase_seconds (worker/train/profiler/step_profiler.cc).
inline constexpr std::string_view kPhases[] = {"forward",      "backward", "optimizer",
                                               "comm_exposed", "bubble",   "data"};

// The label value for a phase from the wire: itself when known, else "other" (bounded labels).
std::string_view PhaseLabel(std::string_view phase);

// One rank's memory in one step (StepReport's memory fields).
struct RankMemory {
  uint64_t allocated = 0;  // memory_bytes
  uint64_t peak = 0;       // peak_memory_bytes
  uint64_t rss = 0;        // rss_bytes
  // The device fields, set only when the report came from a CUDA device (its `device` starts
  // with "cuda"): what the loom_gpu_* gauges show.
  std::optional<uint64_t> gpu_reserved;  // reserved_memory_bytes
  // memory_fragmentation; unset as well when the report's value was not in [0, 1].
  std::optional<double> gpu_fragmentation;
};

// One rank's telemetry from its step reports.
struct RankTelemetry {
  // From the latest step report of the current generation; unset before the first one.
  std::optional<double> overlap_ratio;
  std::optional<double> bubble_ratio;
  std::optional<double> idle_ratio;
  // CommKindLabel(kind) -> bytes summed over the step reports this loomd received for the job
  // (across generations; memory only, so the counter resets with loomd, as counters may).
  std::map<std::string, uint64_t> comm_bytes_total;
  // From the latest step report of the current generation; unset before the first one.
  std::optional<RankMemory> memory;
  // StepReport.device_allocations summed over the job's step reports from a CUDA device (each
  // step once; across generations and kept by this loomd only, as comm_bytes_total); unset while
  // the rank has not reported from one, so CPU ranks get no loom_gpu_* series.
  std::optional<uint64_t> device_allocations_total;
  // PhaseLabel(phase) -> seconds summed over the job's step reports (each step once, like
  // comm_bytes_total).
  std::map<std::string, double> phase_seconds_total;
  // The latest step's seconds; unset before the first report.
  std::optional<double> step_seconds;
  // The memory of the device the rank is placed on; set by the snapshot, not by reports.
  std::optional<uint64_t> device_memory_bytes;
};

// A job's progress (Job.progress, kept from rank 0's step reports), for the
// loom_job_{step,loss,tokens_per_second,...} series. Set for the active jobs that have reported a
// step, except `restarts`, set for every active job.
struct JobProgressTelemetry {
  std::optional<int64_t> step;
  std::optional<double> loss;
  std::optional<double> tokens_per_second;
  std::optional<double> last_step_unix_seconds;
  std::optional<double> mfu;
  int restarts = 0;
};

// The doctor's view of one job (server/doctor), for the loom_job_finding,
// loom_job_stage_imbalance_ratio and loom_rank_straggler_score series.
struct JobDoctorTelemetry {
  // (kind, severity) label values -> raised findings.
  std::map<std::pair<std::string, std::string>, int> findings;
  std::optional<double> stage_imbalance_ratio;
  std::map<int, double> straggler_scores;  // by rank
};

// Where a job's time went (v1::Goodput), for loom_job_goodput_ratio and
// loom_job_lost_seconds{reason}.
struct JobGoodput {
  double ratio = 0;
  // reason ("queued", "starting", "checkpointing", "restarts", "rebalancing", "other") -> seconds
  std::map<std::string, double> lost_seconds;
};

// What the gauges show, taken from the job manager at scrape time.
struct Snapshot {
  std::map<v1::JobState, int> jobs;  // every state, including terminal ones
  int queue_depth = 0;
  int quarantined_gangs = 0;
  std::map<v1::NodeState, int> nodes;
  // kind ("gpu" | "cpu") -> (total, allocated) over READY nodes
  std::map<std::string, std::pair<int, int>> devices;
  // job id -> its step times, for the active jobs that have either.
  std::map<std::string, JobStepTimes> job_step_seconds;
  // job id -> rank -> its telemetry, for the active jobs whose ranks have reported.
  std::map<std::string, std::map<int, RankTelemetry>> ranks;
  // job id -> the doctor's latest report, for the active jobs it has judged.
  std::map<std::string, JobDoctorTelemetry> doctor;
  // job id -> its goodput, for every active job.
  std::map<std::string, JobGoodput> goodput;
  // job id -> its progress, for every active job.
  std::map<std::string, JobProgressTelemetry> progress;
};

class ServerMetrics {
 public:
  // `registry` must outlive this object.
  explicit ServerMetrics(metrics::Registry* registry);
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Installs the function that the scrape hook calls; set once, before serving.
  void SetSnapshotSource(std::function<Snapshot()> source);

  // One RPC ended with gRPC status `code` (0..16; anything else counts as UNKNOWN) after
  // `duration` (negative durations, from a clock stepped backwards, count as zero).
  void RecordRpc(std::string_view method, int code, absl::Duration duration);
  void ObserveSchedulingLatency(absl::Duration latency);
  void IncrementRestarts();
  // Replaces the loom_scaling_efficiency_ratio series of `job` (a job name) by `by_devices`
  // (devices -> efficiency); see above.
  void SetScalingEfficiency(const std::string& job, const std::map<int, double>& by_devices);
  static constexpr size_t kMaxScalingJobs = 100;

  metrics::Registry* registry() { return registry_; }

 private:
  void Collect();
  // Sets the per-job gauges of `jobs` and adds those series to `exported`.
  void CollectJobStepTimes(const std::map<std::string, JobStepTimes>& jobs,
                           std::set<std::pair<std::string, metrics::Labels>>& exported);
  // Sets the per-rank gauges and counters of `ranks` and adds those series to `exported`.
  void CollectRanks(const std::map<std::string, std::map<int, RankTelemetry>>& ranks,
                    std::set<std::pair<std::string, metrics::Labels>>& exported);
  // Sets the doctor's per-job and per-rank gauges and adds those series to `exported`.
  void CollectDoctor(const std::map<std::string, JobDoctorTelemetry>& jobs,
                     std::set<std::pair<std::string, metrics::Labels>>& exported);
  // Sets the goodput gauges of `jobs` and adds those series to `exported`.
  void CollectGoodput(const std::map<std::string, JobGoodput>& jobs,
                      std::set<std::pair<std::string, metrics::Labels>>& exported);
  // Sets the progress gauges of `jobs` and adds those series to `exported`.
  void CollectProgress(const std::map<std::string, JobProgressTelemetry>& jobs,
                       std::set<std::pair<std::string, metrics::Labels>>& exported);
  // Sets the per-rank phase and step-time series of one rank (`labels`: job, rank).
  void CollectRankPhases(const metrics::Labels& labels, const RankTelemetry& telemetry,
                         std::set<std::pair<std::string, metrics::Labels>>& exported);
  // Sets the memory gauges of one rank (`labels`: job, rank) and adds them to `exported`.
  void CollectRankMemory(const metrics::Labels& labels, const RankMemory& memory,
                         std::set<std::pair<std::string, metrics::Labels>>& exported);

  metrics::Registry* const registry_;
  metrics::Histogram& scheduling_latency_;
  // loom_rpc_duration_seconds: 0.25 ms to 16 s. A unary call on loopback takes about a
  // millisecond; long streams land in the last buckets and +Inf.
  const std::vector<double> rpc_duration_buckets_ = metrics::ExponentialBuckets(0.00025, 2, 17);
  // The RPC series of one method, found in the registry once. The registry's lookup builds a
  // label map and takes two locks; done twice per RPC it cost CreateJob over gRPC about 3 % of
  // its rate. The series are never removed, so the pointers stay valid. A code's counter is
  // made on the code's first use, so that no zero series are exported.
  struct RpcSeries {
    metrics::Histogram* duration = nullptr;
    std::array<metrics::Counter*, 17> by_code{};  // indexed by gRPC status code
  };
  absl::Mutex rpc_mu_;
  std::map<std::string, RpcSeries, std::less<>> rpc_series_ ABSL_GUARDED_BY(rpc_mu_);
  metrics::Counter& restarts_;
  absl::Mutex mu_;
  std::function<Snapshot()> source_ ABSL_GUARDED_BY(mu_);
  // The per-job and per-rank series exported by the last Collect(), (metric name, labels), so
  // that those of jobs (or ranks) no longer reported can be removed.
  std::set<std::pair<std::string, metrics::Labels>> job_series_ ABSL_GUARDED_BY(mu_);
  // loom_scaling_efficiency_ratio: job name -> its devices label values, and the job names in
  // the order they were last set (oldest first).
  absl::Mutex scaling_mu_;
  std::map<std::string, std::vector<std::string>> scaling_series_ ABSL_GUARDED_BY(scaling_mu_);
  std::vector<std::string> scaling_order_ ABSL_GUARDED_BY(scaling_mu_);
};

}  // namespace loom::server_metrics
