// The doctor's telemetry window of one job generation (issue 12, part 1): each rank's most recent
// step reports (step time, phases, ratios, memory) and its most recent per-block cost samples,
// bounded, re-sent reports counted once. The JobManager keeps one per active job and resets it
// at each new generation; the doctor's rules (rules.h) read it.
//
// Pure and not thread-safe (the JobManager holds it under its mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "loom/v1/node.pb.h"

namespace loom::doctor {

// One rank's step, from its StepReport.
struct RankStep {
  int64_t step = 0;
  double step_seconds = 0;
  double data = 0, forward = 0, backward = 0, optimizer = 0, comm_exposed = 0, bubble = 0;
  bool has_phases = false;  // the report carried phase_seconds
  double overlap_ratio = 0, idle_ratio = 0;
  uint64_t dp_bytes = 0;  // comm_bytes["all_reduce"]
  uint64_t memory_bytes = 0, reserved_bytes = 0, peak_bytes = 0;
  double fragmentation = 0;
  uint64_t device_allocations = 0;
  bool cuda = false;  // device starts with "cuda"
  // Compute: the step minus what it waited on (exposed communication and pipeline bubble).
  double busy() const { return forward + backward + optimizer + data; }
};

// One sampled step's per-block costs (StepReport.block_costs).
struct BlockSample {
  int64_t step = 0;
  int first_block = 0;
  std::vector<double> seconds;  // forward + backward per block
  bool has_embedding = false;
  double embedding = 0;  // forward + backward
  bool has_head = false;
  double head = 0;
};

struct RankWindow {
  std::deque<RankStep> steps;      // oldest first, at most kMaxSteps
  std::deque<BlockSample> blocks;  // oldest first, at most kMaxBlockSamples
  int64_t last_step = -1;          // the newest step accepted
  int64_t accepted = 0;            // training reports accepted, warmup included
};

class TelemetryWindow {
 public:
  // Steps of each rank kept (the window the rules judge).
  static constexpr int kMaxSteps = 16;
  // Per-block samples of each rank kept (one every kBlockSampleEvery steps on the rank side).
  static constexpr int kMaxBlockSamples = 8;
  // The first training reports of each rank in a generation are warmup (allocation, cold
  // caches) and not kept.
  static constexpr int kWarmupSteps = 2;

  // Offers one report of the current generation. A validation or checkpoint report, a step not
  // later than the rank's newest, or a non-positive or non-finite step time is ignored.
  // Returns whether it was kept.
  bool Add(const v1::StepReport& report);
  void Reset() { ranks_.clear(); }

  const std::map<int, RankWindow>& ranks() const { return ranks_; }
  // Rank 0's newest step (-1 before any).
  int64_t newest_step() const;

 private:
  std::map<int, RankWindow> ranks_;
};

}  // namespace loom::doctor
