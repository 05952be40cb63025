// The doctor's rules (issue 12, part 2; DESIGN.md, "The planner and the doctor"): pure functions
// from one job's telemetry window (telemetry_window.h) and its layout to findings
// {kind, severity, subject, evidence, fix, predicted gain}. No clock, no RPC, no logging: the
// JobManager builds the input under its lock, and persistence over windows is the tracker's job
// (finding_tracker.h).
//
// Statistics are robust: every per-rank figure is the median over the rank's window, spreads
// are MADs. A rank with fewer than kMinSteps steps in the window is not judged (except by
// NO_PROFILE). Each rule has a raise threshold and a lower keep threshold used for findings
// already raised (input.raised), so a finding at the edge does not flap.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loom/v1/job.pb.h"
#include "server/doctor/telemetry_window.h"

namespace loom::doctor {

struct Thresholds {
  // STAGE_IMBALANCE: the busiest stage's busy time / the mean over stages.
  double imbalance_raise = 1.10, imbalance_keep = 1.05;
  // ... and the measured re-split must be predicted to save at least this fraction of the step.
  double imbalance_min_gain = 0.03;
  // ... and no re-split is proposed on a CPU node running more of the job's ranks than it has
  // cores whose ranks' busy time is at least this many times cores x step: the cores are full
  // for the whole step, so the node's total work, not the slowest stage, sets the step.
  double core_bound_load = 1.0;
  // STRAGGLER: own busy time / the median of its dp peers at the same (stage, tp) position,
  // and the gap must exceed this many MADs of the peers' step-to-step spread.
  double straggler_raise = 1.25, straggler_keep = 1.12;
  double straggler_mads = 4.0;
  // EXPOSED_COMMUNICATION: the median over ranks of comm_exposed / step.
  double exposed_raise = 0.15, exposed_keep = 0.10;
  // LAYOUT: the best layout's calibrated prediction must be below measured * (1 - this).
  double layout_gain_raise = 0.20, layout_gain_keep = 0.15;
  // MEMORY: fragmentation above this with at least memory_min_waste_bytes held but unused.
  double fragmentation_raise = 0.30, fragmentation_keep = 0.20;
  uint64_t memory_min_waste_bytes = 32ull << 20;
  // ...unless those bytes hardly move (MAD at most this fraction of their median) and the rank
  // reserves less than memory_pressure of its device: then they are the cache's fixed rounding.
  double waste_stable_fraction = 0.05, memory_pressure = 0.90;
  // MEMORY headroom: a micro-batch whose predicted peak is under this fraction of the device
  // memory "fits with margin"; a current peak above memory_near_limit is too close.
  double memory_margin = 0.80, memory_near_limit = 0.95;
  // NO_PROFILE: a rank whose newest step lags rank 0's by more than this is stale.
  int64_t stale_steps = 32;
};

// The running layout (Job.layout, resolved).
struct LayoutInfo {
  int data = 1, tensor = 1, pipeline = 1;
  int micro_batch = 1;
  int num_micro_batches = 1;
  int layers = 1;
  std::vector<int> blocks_per_stage;  // empty: the runtime's even split
  bool zero1 = false;
  double dp_bucket_mb = 25.0;  // spec.parallelism.dp_bucket_mb (the runtime's default)
  bool dp_overlap = true;      // spec.parallelism.dp_overlap
};

// The planner's best layout for this job's model and devices, and its prediction for the layout
// running, both with the same calibration (LAYOUT).
struct LayoutAdvice {
  v1::Layout best;
  double best_predicted_step_seconds = 0;
  double current_predicted_step_seconds = 0;
};

// The memory model's predicted peak per device for a micro-batch size (MEMORY headroom).
struct MicroBatchFit {
  int micro_batch = 0;
  uint64_t predicted_peak_bytes = 0;
};

struct DoctorInput {
  LayoutInfo layout;
  const TelemetryWindow* window = nullptr;  // required
  std::map<int, std::string> rank_nodes;    // rank -> node name, where known
  // A job on CPU devices: the cores of each node it runs on (Node.cpu_cores; absent or 0 when
  // unknown). Empty for GPU jobs, whose ranks do not share a node's cores for their compute.
  std::map<std::string, int> node_cpu_cores;
  std::optional<LayoutAdvice> layout_advice;
  uint64_t device_memory_bytes = 0;  // 0: headroom not judged
  std::vector<MicroBatchFit> micro_batch_fits;
  std::set<std::string> raised;  // FindingKeys of raised findings (their keep thresholds apply)
  Thresholds thresholds;
};

struct Diagnosis {
  std::vector<v1::Finding> findings;
  std::vector<v1::StageReport> stages;
  std::vector<v1::RankReport> ranks;
  double step_seconds = 0;  // rank 0's median
  bool judged = false;      // enough steps in the window to judge anything
};

// A rank's steps in the window needed before it is judged.
inline constexpr int kMinSteps = 4;

// The even split the runtime uses when blocks_per_stage is empty (earlier stages take the
// remainder).
std::vector<int> EvenSplit(int layers, int stages);

Diagnosis Diagnose(const DoctorInput& input);

}  // namespace loom::doctor
