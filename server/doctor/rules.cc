#include "server/doctor/rules.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/doctor/finding_tracker.h"
#include "server/doctor/stats.h"
#include "server/planner/stage_partitioner.h"

namespace loom::doctor {
namespace {

// A rank's position in the layout: tensor fastest, then data, then pipeline.
struct Position {
  int tp = 0, dp = 0, stage = 0;
};

Position PositionOf(int rank, const LayoutInfo& l) {
  Position p;
  p.tp = rank % l.tensor;
  p.dp = (rank / l.tensor) % l.data;
  p.stage = rank / (l.tensor * l.data);
  return p;
}

// Per-rank medians over its window.
struct RankFigures {
  int rank = 0;
  Position pos;
  int steps = 0;
  bool has_phases = false;
  double step = 0, busy = 0, comm_exposed = 0, bubble = 0, idle = 0, overlap = 0;
  double busy_mad = 0;
  double fragmentation = 0, waste_bytes = 0, device_allocations = 0;
  double waste_mad = 0;       // how much the held-but-unused bytes move from step to step
  double reserved_bytes = 0;  // median
  double peak_bytes = 0;
  uint64_t dp_bytes = 0;
  int64_t last_step = -1;
};

template <typename F>
double MedianOf(const std::deque<RankStep>& steps, F field) {
  std::vector<double> v;
  v.reserve(steps.size());
  for (const RankStep& s : steps) v.push_back(field(s));
  return Median(std::move(v));
}

RankFigures FiguresOf(int rank, const RankWindow& w, const LayoutInfo& layout) {
  RankFigures f;
  f.rank = rank;
  f.pos = PositionOf(rank, layout);
  f.steps = static_cast<int>(w.steps.size());
  f.last_step = w.last_step;
  for (const RankStep& s : w.steps) f.has_phases = f.has_phases || s.has_phases;
  f.step = MedianOf(w.steps, [](const RankStep& s) { return s.step_seconds; });
  f.busy = MedianOf(w.steps, [](const RankStep& s) { return s.busy(); });
  std::vector<double> busy;
  for (const RankStep& s : w.steps) busy.push_back(s.busy());
  f.busy_mad = Mad(busy);
  f.comm_exposed = MedianOf(w.steps, [](const RankStep& s) { return s.comm_exposed; });
  f.bubble = MedianOf(w.steps, [](const RankStep& s) { return s.bubble; });
  f.idle = MedianOf(w.steps, [](const RankStep& s) { return s.idle_ratio; });
  f.overlap = MedianOf(w.steps, [](const RankStep& s) { return s.overlap_ratio; });
  f.fragmentation = MedianOf(w.steps, [](const RankStep& s) { return s.fragmentation; });
  std::vector<double> waste;
  for (const RankStep& s : w.steps) {
    waste.push_back(s.reserved_bytes > s.memory_bytes
                        ? static_cast<double>(s.reserved_bytes - s.memory_bytes)
                        : 0.0);
  }
  f.waste_bytes = Median(waste);
  f.waste_mad = Mad(waste);
  f.reserved_bytes =
      MedianOf(w.steps, [](const RankStep& s) { return static_cast<double>(s.reserved_bytes); });
  f.device_allocations = MedianOf(
      w.steps, [](const RankStep& s) { return static_cast<double>(s.device_allocations); });
  f.peak_bytes =
      MedianOf(w.steps, [](const RankStep& s) { return static_cast<double>(s.peak_bytes); });
  if (!w.steps.empty()) f.dp_bytes = w.steps.back().dp_bytes;
  return f;
}

void AddEvidence(v1::Finding* f, const std::string& name, double value, const std::string& series) {
  v1::FindingEvidence* e = f->add_evidence();
  e->set_name(name);
  e->set_value(value);
  e->set_series(series);
}

v1::Finding NewFinding(v1::FindingKind kind, v1::FindingSeverity severity, std::string subject) {
  v1::Finding f;
  f.set_kind(kind);
  f.set_severity(severity);
  f.set_subject(std::move(subject));
  f.set_rank(-1);
  f.set_stage(-1);
  return f;
}

std::string RankSubject(int rank, const std::map<int, std::string>& nodes) {
  auto it = nodes.find(rank);
  if (it == nodes.end() || it->second.empty()) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " (", it->second, ")");
}

bool Raised(const DoctorInput& in, const v1::Finding& f) {
  return in.raised.count(FindingKey(f)) > 0;
}

// The measured cost of every block (seconds per step, forward + backward, the median over the
// samples of the ranks holding it), the embedding and the head; nullopt until every block has
// a sample.
struct MeasuredCosts {
  std::vector<double> blocks;
  double embedding = 0, head = 0;
};

std::optional<MeasuredCosts> MeasuredBlockCosts(const TelemetryWindow& w, int layers) {
  std::vector<std::vector<double>> per_block(static_cast<size_t>(layers));
  std::vector<double> emb, head;
  for (const auto& [rank, rw] : w.ranks()) {
    for (const BlockSample& b : rw.blocks) {
      for (size_t i = 0; i < b.seconds.size(); ++i) {
        // In 64 bits: first_block comes from a node's message and may be anything.
        const int64_t j = int64_t{b.first_block} + static_cast<int64_t>(i);
        if (j >= 0 && j < layers) per_block[static_cast<size_t>(j)].push_back(b.seconds[i]);
      }
      if (b.has_embedding) emb.push_back(b.embedding);
      if (b.has_head) head.push_back(b.head);
    }
  }
  MeasuredCosts c;
  for (auto& v : per_block) {
    if (v.empty()) return std::nullopt;
    c.blocks.push_back(Median(std::move(v)));
  }
  if (emb.empty() || head.empty()) return std::nullopt;
  c.embedding = Median(std::move(emb));
  c.head = Median(std::move(head));
  return c;
}

// A CPU node whose cores this job's ranks keep full: more ranks than cores, and their busy time
// (which counts the time a runnable rank waits for a core) at least core_bound_load x cores x
// step. The most loaded such node, or nullopt.
struct CoreBound {
  std::string node;
  int cores = 0, ranks = 0;
  double load = 0;  // the ranks' busy time / (cores x step)
};

std::optional<CoreBound> CoreBoundNode(const DoctorInput& in, const std::vector<RankFigures>& ranks,
                                       double step) {
  std::optional<CoreBound> worst;
  if (step <= 0) return worst;
  for (const auto& [node, cores] : in.node_cpu_cores) {
    if (cores <= 0) continue;
    CoreBound b{node, cores, 0, 0};
    for (const auto& [rank, rank_node] : in.rank_nodes) b.ranks += rank_node == node ? 1 : 0;
    double busy = 0;
    for (const RankFigures& r : ranks) {
      auto it = in.rank_nodes.find(r.rank);
      if (it != in.rank_nodes.end() && it->second == node && r.steps >= kMinSteps) busy += r.busy;
    }
    b.load = busy / (cores * step);
    if (b.ranks <= cores || b.load < in.thresholds.core_bound_load) continue;
    if (!worst || b.load > worst->load) worst = b;
  }
  return worst;
}

void StageImbalance(const DoctorInput& in, const std::vector<RankFigures>& ranks, double step,
                    Diagnosis* out) {
  const LayoutInfo& l = in.layout;
  if (l.pipeline < 2) return;
  const std::vector<int> split = l.blocks_per_stage.size() == static_cast<size_t>(l.pipeline)
                                     ? l.blocks_per_stage
                                     : EvenSplit(l.layers, l.pipeline);
  std::vector<std::vector<double>> busy(static_cast<size_t>(l.pipeline));
  std::vector<std::vector<double>> idle(static_cast<size_t>(l.pipeline));
  for (const RankFigures& r : ranks) {
    if (r.steps < kMinSteps || !r.has_phases || r.pos.stage >= l.pipeline) continue;
    busy[static_cast<size_t>(r.pos.stage)].push_back(r.busy);
    idle[static_cast<size_t>(r.pos.stage)].push_back(r.idle);
  }
  std::vector<double> stage_busy;
  for (int s = 0; s < l.pipeline; ++s) {
    if (busy[static_cast<size_t>(s)].empty()) return;  // a stage not measured yet
    v1::StageReport* sr = nullptr;
    for (v1::StageReport& existing : out->stages) {
      if (existing.stage() == s) sr = &existing;
    }
    stage_busy.push_back(Median(busy[static_cast<size_t>(s)]));
    if (sr != nullptr) {
      sr->set_busy_seconds(stage_busy.back());
      sr->set_idle_ratio(Median(idle[static_cast<size_t>(s)]));
    }
  }
  double mean = 0;
  for (double b : stage_busy) mean += b;
  mean /= static_cast<double>(stage_busy.size());
  if (mean <= 0) return;
  const int worst =
      static_cast<int>(std::max_element(stage_busy.begin(), stage_busy.end()) - stage_busy.begin());
  const double ratio = stage_busy[static_cast<size_t>(worst)] / mean;

  v1::Finding f =
      NewFinding(v1::STAGE_IMBALANCE,
                 ratio > 1.5 ? v1::FINDING_SEVERITY_CRITICAL : v1::FINDING_SEVERITY_WARNING,
                 absl::StrCat("stage ", worst));
  const double threshold =
      Raised(in, f) ? in.thresholds.imbalance_keep : in.thresholds.imbalance_raise;
  if (ratio <= threshold) return;
  f.set_stage(worst);
  f.set_summary(absl::StrFormat(
      "pipeline stage %d is the bottleneck: its busy time is %.2fx the mean over stages; the "
      "other stages wait on it",
      worst, ratio));
  AddEvidence(&f, "imbalance_ratio", ratio, "loom_job_stage_imbalance_ratio");
  for (int s = 0; s < l.pipeline; ++s) {
    AddEvidence(&f, absl::StrCat("stage ", s, " busy_seconds"), stage_busy[static_cast<size_t>(s)],
                "StepReport.phase_seconds{data,forward,backward,optimizer}");
    AddEvidence(&f, absl::StrCat("stage ", s, " idle_ratio"), Median(idle[static_cast<size_t>(s)]),
                "loom_rank_idle_ratio");
  }
  AddEvidence(&f, "step_seconds", step, "loom_job_step_seconds");

  // Moving blocks leaves the job's total work as it is. Where the cores of a node are full for
  // the whole step, that total work sets the step, and a re-split would only cost a restart:
  // measured on 2 cores, data 2 x pipeline 4 re-split [2,2,2,2] -> [2,2,3,1] was predicted
  // -7 % and measured +5.9 % (docs/benchmarks.md). The waiting stages' idle time is then time
  // spent waiting for a core as much as for the bottleneck.
  if (const std::optional<CoreBound> bound = CoreBoundNode(in, ranks, step); bound) {
    AddEvidence(&f, absl::StrCat(bound->node, " cpu_cores"), bound->cores, "Node.cpu_cores");
    AddEvidence(&f, absl::StrCat(bound->node, " ranks"), bound->ranks, "Job.placements");
    AddEvidence(&f, absl::StrCat(bound->node, " busy_per_core_step"), bound->load,
                "StepReport.phase_seconds{data,forward,backward,optimizer}");
    f.set_fix(absl::StrFormat(
        "no re-split proposed: %d ranks of this job share the %d cores of %s and keep them busy "
        "(their busy time is %.2fx cores x step), so the node's total work sets the step and "
        "moving blocks does not shrink it; run at most %d CPU devices of this job per node "
        "(resources.cpu_devices, or more nodes) for the stages to overlap",
        bound->ranks, bound->cores, bound->node, bound->load, bound->cores));
    out->findings.push_back(std::move(f));
    return;
  }

  // The fix: the planner's exact partitioner fed with the measured per-block costs.
  const std::optional<MeasuredCosts> costs = MeasuredBlockCosts(*in.window, l.layers);
  if (!costs) {
    f.set_fix(
        "wait for per-block samples from every stage (block_seconds, every few steps) to compute "
        "a measured parallelism.blocks_per_stage");
    out->findings.push_back(std::move(f));
    return;
  }
  planner::PartitionProblem problem;
  problem.block_cost = costs->blocks;
  problem.first_stage_cost = costs->embedding;
  problem.last_stage_cost = costs->head;
  problem.num_stages = l.pipeline;
  absl::StatusOr<planner::Partition> best = planner::PartitionStages(problem);
  const planner::Partition current = planner::EvaluatePartition(problem, split);
  if (!best.ok() || current.bottleneck <= 0) return;
  for (size_t s = 0; s < current.stage_cost.size(); ++s) {
    AddEvidence(&f, absl::StrCat("stage ", s, " measured_block_seconds"), current.stage_cost[s],
                "StepReport.block_costs");
  }
  // With m micro-batches a pipeline step (1F1B or GPipe) takes about sum_s c_s / m +
  // (m - 1) / m * max_s c_s, c_s a stage's work per step: filling and draining the pipeline
  // passes every stage once, then the slowest stage paces the other m - 1 micro-batches. Moving
  // blocks leaves the sum as it is, so the step saves (m - 1) / m of the bottleneck's reduction,
  // and nothing with one micro-batch (the stages then run one after another). Measured against
  // this job: the bottleneck's whole reduction overestimated a 2-stage, 4-micro-batch re-split's
  // gain about threefold (issue 12's note).
  const int m = std::max(1, l.num_micro_batches);
  const double saved = (m - 1.0) / m * (current.bottleneck - best->bottleneck);
  const double gain = step > 0 ? std::clamp(saved / step, 0.0, 0.99) : 0.0;
  AddEvidence(&f, "num_micro_batches", m, "Job.layout");
  if (best->blocks_per_stage == split || gain < in.thresholds.imbalance_min_gain) {
    if (m == 1 && best->blocks_per_stage != split) {
      f.set_fix(
          "no re-split pays with one micro-batch per step: the stages run one after another; a "
          "smaller parallelism.micro_batch (more micro-batches per step) lets the stages overlap");
    } else {
      // Blocks cannot be moved to help (the embedding or the head alone is the bottleneck).
      f.set_fix(
          "no re-split of the blocks helps: the bottleneck is the stage's fixed part (embedding "
          "or head); consider fewer pipeline stages");
    }
    out->findings.push_back(std::move(f));
    return;
  }
  for (int b : best->blocks_per_stage) f.add_blocks_per_stage(b);
  f.set_predicted_gain(gain);
  f.set_predicted_step_seconds(step - saved);
  f.set_fix(absl::StrFormat(
      "set parallelism.blocks_per_stage: [%s] (from the measured per-block costs through the "
      "planner's partitioner; now [%s]): predicted step %.4f s instead of %.4f s (-%.0f%%)",
      absl::StrJoin(best->blocks_per_stage, ", "), absl::StrJoin(split, ", "), step - saved, step,
      gain * 100));
  out->findings.push_back(std::move(f));
}

void Stragglers(const DoctorInput& in, const std::vector<RankFigures>& ranks, Diagnosis* out) {
  const LayoutInfo& l = in.layout;
  for (const RankFigures& r : ranks) {
    v1::RankReport* rr = nullptr;
    for (v1::RankReport& x : out->ranks) {
      if (x.rank() == r.rank) rr = &x;
    }
    if (rr) rr->set_straggler_score(1.0);
    if (l.data < 2 || r.steps < kMinSteps || !r.has_phases || r.busy <= 0) continue;
    std::vector<double> peers, spread;
    for (const RankFigures& p : ranks) {
      if (p.rank == r.rank || p.steps < kMinSteps || !p.has_phases) continue;
      if (p.pos.stage != r.pos.stage || p.pos.tp != r.pos.tp) continue;
      peers.push_back(p.busy);
      spread.push_back(p.busy_mad);
    }
    if (peers.empty()) continue;
    const double peer = Median(peers);
    const double score = peer / r.busy;  // below 1: slower than its peers
    if (rr) rr->set_straggler_score(score);
    v1::Finding f =
        NewFinding(v1::STRAGGLER, v1::FINDING_SEVERITY_WARNING, RankSubject(r.rank, in.rank_nodes));
    const double threshold =
        Raised(in, f) ? in.thresholds.straggler_keep : in.thresholds.straggler_raise;
    const double noise = in.thresholds.straggler_mads * std::max(Median(spread), r.busy_mad);
    if (r.busy <= peer * threshold || r.busy - peer <= noise) continue;
    f.set_rank(r.rank);
    f.set_stage(r.pos.stage);
    if (auto it = in.rank_nodes.find(r.rank); it != in.rank_nodes.end()) f.set_node(it->second);
    f.set_summary(absl::StrFormat(
        "rank %d%s computes %.2fx slower than its %d data-parallel peer(s) at the same position "
        "(stage %d, tensor rank %d); every other rank waits for it",
        r.rank, f.node().empty() ? "" : absl::StrCat(" on ", f.node()), r.busy / peer,
        static_cast<int>(peers.size()), r.pos.stage, r.pos.tp));
    AddEvidence(&f, "straggler_score", score, "loom_rank_straggler_score");
    AddEvidence(&f, "busy_seconds", r.busy,
                "StepReport.phase_seconds{data,forward,backward,optimizer}");
    AddEvidence(&f, "peer_median_busy_seconds", peer,
                "StepReport.phase_seconds{data,forward,backward,optimizer}");
    AddEvidence(&f, "step_seconds", r.step, "StepReport.step_seconds");
    f.set_fix(absl::StrCat(
        "check the node", f.node().empty() ? "" : absl::StrCat(" ", f.node()),
        " (other load, thermal throttling, a slower device); drain it (loomctl node drain) to "
        "move the job"));
    const double saved = r.busy - peer;
    if (r.step > 0) {
      f.set_predicted_gain(std::clamp(saved / r.step, 0.0, 0.99));
      f.set_predicted_step_seconds(r.step - saved);
    }
    out->findings.push_back(std::move(f));
  }
}

// ExposedCommunication's band of gradient buckets per step. Each bucket is one all-reduce paying
// its own latency: past kManyBuckets the latencies, not the bytes, make the exposed time, and
// larger buckets are the fix. Below kFewBuckets the first bucket fills late in backward: smaller
// ones could start earlier. Between the two, smaller buckets would only add latencies: the fix is
// less traffic.
constexpr double kManyBuckets = 64;
constexpr double kFewBuckets = 4;
// The bucket size both bucket fixes advise: a step's gradients in kAdvisedBuckets all-reduces.
// Inside the band (twice its lower end), so a job that takes the advice is not told to undo it:
// the advice never swings from larger to smaller buckets and back. At its lower end, because
// each bucket pays a latency and the band's lower end is where the rule itself holds the
// overlap to be enough. Clamped to what the spec validator accepts ((0, 1024] MiB), which keeps
// the promise for 8 KiB to 64 GiB of gradients per step. Four significant digits, so that 1024
// is written "1024", not "1.02e+03".
constexpr double kAdvisedBuckets = 8;
std::string AdvisedBucketMb(uint64_t dp_bytes) {
  const double mb = static_cast<double>(dp_bytes) / kAdvisedBuckets / 1048576.0;
  return absl::StrFormat("%.4g (%.0f all-reduces per step)", std::clamp(mb, 0.001, 1024.0),
                         kAdvisedBuckets);
}

void ExposedCommunication(const DoctorInput& in, const std::vector<RankFigures>& ranks, double step,
                          Diagnosis* out) {
  std::vector<double> ratio, overlap;
  uint64_t dp_bytes = 0;
  for (const RankFigures& r : ranks) {
    if (r.steps < kMinSteps || !r.has_phases || r.step <= 0) continue;
    ratio.push_back(r.comm_exposed / r.step);
    overlap.push_back(r.overlap);
    dp_bytes = std::max(dp_bytes, r.dp_bytes);
  }
  if (ratio.empty()) return;
  const double exposed = Median(ratio);
  v1::Finding f = NewFinding(
      v1::EXPOSED_COMMUNICATION,
      exposed > 0.3 ? v1::FINDING_SEVERITY_CRITICAL : v1::FINDING_SEVERITY_WARNING, "job");
  const double threshold = Raised(in, f) ? in.thresholds.exposed_keep : in.thresholds.exposed_raise;
  if (exposed <= threshold) return;
  const double ov = Median(overlap);
  f.set_summary(absl::StrFormat(
      "the ranks wait on communication for %.0f%% of the step (median over ranks); the "
      "data-parallel overlap ratio is %.2f",
      exposed * 100, ov));
  AddEvidence(&f, "comm_exposed_ratio", exposed,
              "loom_rank_phase_seconds_total{phase=comm_exposed}");
  AddEvidence(&f, "overlap_ratio", ov, "loom_rank_overlap_ratio");
  AddEvidence(&f, "dp_all_reduce_bytes", static_cast<double>(dp_bytes),
              "loom_rank_comm_bytes_total{kind=all_reduce}");
  std::string fix;
  const double bucket_bytes = in.layout.dp_bucket_mb * 1048576.0;
  const double buckets = bucket_bytes > 0 ? static_cast<double>(dp_bytes) / bucket_bytes : 0;
  if (in.layout.data > 1 && !in.layout.dp_overlap) {
    fix =
        "overlap the gradient all-reduce with backward: set spec.parallelism.dp_overlap to true "
        "(the default), so each bucket is summed while the earlier blocks' backward runs";
  } else if (in.layout.data > 1 && dp_bytes > 0 && buckets > kManyBuckets) {
    AddEvidence(&f, "dp_buckets_per_step", buckets, "spec.parallelism.dp_bucket_mb");
    fix = absl::StrFormat(
        "larger gradient buckets: %.0f all-reduces of %.3g MiB per step each pay their latency; "
        "set spec.parallelism.dp_bucket_mb to %s",
        buckets, in.layout.dp_bucket_mb, AdvisedBucketMb(dp_bytes));
  } else if (in.layout.data > 1 && dp_bytes > 0 && ov < 0.5 && buckets < kFewBuckets) {
    AddEvidence(&f, "dp_buckets_per_step", buckets, "spec.parallelism.dp_bucket_mb");
    fix = absl::StrFormat(
        "smaller gradient buckets so the first all-reduce starts earlier in backward: %.3g MiB "
        "of gradients per step fill %.3g bucket(s) of %.3g MiB; set "
        "spec.parallelism.dp_bucket_mb to %s",
        static_cast<double>(dp_bytes) / 1048576.0, buckets, in.layout.dp_bucket_mb,
        AdvisedBucketMb(dp_bytes));
  } else if (in.layout.data > 1) {
    fix =
        "less data-parallel traffic: fewer data-parallel replicas with more micro-batches "
        "(larger parallelism.micro_batch), or a layout keeping traffic inside a node "
        "(loomctl plan)";
  } else {
    fix = "a layout with less communication per step (loomctl plan shows the ranking)";
  }
  f.set_fix(fix);
  // Hiding the exposed time entirely is the upper bound of the gain.
  const double saved = exposed * step;
  if (step > 0) {
    f.set_predicted_gain(std::clamp(exposed, 0.0, 0.99));
    f.set_predicted_step_seconds(step - saved);
  }
  out->findings.push_back(std::move(f));
}

void Layout(const DoctorInput& in, double step, Diagnosis* out) {
  if (!in.layout_advice || step <= 0) return;
  const LayoutAdvice& a = *in.layout_advice;
  if (a.current_predicted_step_seconds <= 0 || a.best_predicted_step_seconds <= 0) return;
  // The job's own calibration: what it measures over what was predicted for it.
  const double scale = step / a.current_predicted_step_seconds;
  const double best = a.best_predicted_step_seconds * scale;
  const double gain = 1.0 - best / step;
  v1::Finding f = NewFinding(v1::LAYOUT, v1::FINDING_SEVERITY_WARNING, "job");
  const double threshold =
      Raised(in, f) ? in.thresholds.layout_gain_keep : in.thresholds.layout_gain_raise;
  if (gain <= threshold) return;
  const v1::Layout& b = a.best;
  const std::string name = absl::StrFormat("data=%d tensor=%d pipeline=%d micro_batch=%d", b.data(),
                                           b.tensor(), b.pipeline(), b.micro_batch());
  f.set_summary(absl::StrFormat(
      "the planner's best layout (%s) is predicted %.0f%% faster than the running one", name,
      gain * 100));
  AddEvidence(&f, "measured_step_seconds", step, "loom_job_step_seconds");
  AddEvidence(&f, "predicted_step_seconds", a.current_predicted_step_seconds,
              "loom_job_predicted_step_seconds");
  AddEvidence(&f, "best_predicted_step_seconds", a.best_predicted_step_seconds, "PlanJob");
  AddEvidence(&f, "calibration_scale", scale, "measured / predicted");
  *f.mutable_layout() = b;
  f.set_fix(absl::StrCat("set parallelism to ", name, " (or parallelism: {auto: {}})"));
  f.set_predicted_gain(std::clamp(gain, 0.0, 0.99));
  f.set_predicted_step_seconds(best);
  out->findings.push_back(std::move(f));
}

void Memory(const DoctorInput& in, const std::vector<RankFigures>& ranks, Diagnosis* out) {
  // Fragmentation and steady-state allocations: per rank.
  for (const RankFigures& r : ranks) {
    if (r.steps < kMinSteps) continue;
    v1::Finding f =
        NewFinding(v1::MEMORY, v1::FINDING_SEVERITY_WARNING, RankSubject(r.rank, in.rank_nodes));
    const double threshold =
        Raised(in, f) ? in.thresholds.fragmentation_keep : in.thresholds.fragmentation_raise;
    // Unused bytes that are the same every step are the cache's rounding (a buffer of 1-20 MiB
    // leaves the tail of its 20 MiB segment free), not pieces a changing shape left behind: they
    // cost nothing until the device is nearly full, so they count only then.
    const bool stable = r.waste_mad <= in.thresholds.waste_stable_fraction * r.waste_bytes;
    const bool pressed = in.device_memory_bytes > 0 &&
                         r.reserved_bytes >= in.thresholds.memory_pressure *
                                                 static_cast<double>(in.device_memory_bytes);
    const bool fragmented =
        r.fragmentation > threshold &&
        r.waste_bytes >= static_cast<double>(in.thresholds.memory_min_waste_bytes) &&
        (!stable || pressed);
    const bool allocating = r.device_allocations > 0;
    if (!fragmented && !allocating) continue;
    f.set_rank(r.rank);
    f.set_stage(r.pos.stage);
    if (auto it = in.rank_nodes.find(r.rank); it != in.rank_nodes.end()) f.set_node(it->second);
    f.set_summary(absl::StrFormat(
        "rank %d's allocator %s: %.0f MiB held but unused, fragmentation %.2f, %.0f device "
        "allocations per step",
        r.rank, allocating ? "keeps allocating in the steady state" : "is fragmented",
        r.waste_bytes / 1048576.0, r.fragmentation, r.device_allocations));
    AddEvidence(&f, "memory_fragmentation", r.fragmentation, "loom_gpu_memory_fragmentation_ratio");
    AddEvidence(&f, "reserved_minus_allocated_bytes", r.waste_bytes,
                "loom_gpu_memory_bytes{kind=reserved} - loom_gpu_memory_bytes{kind=allocated}");
    AddEvidence(&f, "device_allocations_per_step", r.device_allocations,
                "loom_gpu_device_allocations_total");
    f.set_fix(
        "keep the step's shapes fixed (same micro_batch and seq_len every step) so the caching "
        "allocator reuses its blocks; a smaller parallelism.micro_batch lowers the peak");
    out->findings.push_back(std::move(f));
  }
  // Headroom: the memory model's prediction against the device.
  if (in.device_memory_bytes == 0 || in.micro_batch_fits.empty()) return;
  const double device = static_cast<double>(in.device_memory_bytes);
  const MicroBatchFit* current = nullptr;
  const MicroBatchFit* largest = nullptr;
  for (const MicroBatchFit& m : in.micro_batch_fits) {
    if (m.micro_batch == in.layout.micro_batch) current = &m;
    if (m.micro_batch > in.layout.micro_batch &&
        static_cast<double>(m.predicted_peak_bytes) <= in.thresholds.memory_margin * device &&
        (largest == nullptr || m.micro_batch > largest->micro_batch)) {
      largest = &m;
    }
  }
  if (current == nullptr) return;
  const double now = static_cast<double>(current->predicted_peak_bytes);
  v1::Finding f = NewFinding(v1::MEMORY, v1::FINDING_SEVERITY_INFO, "job");
  if (now > in.thresholds.memory_near_limit * device) {
    f.set_severity(v1::FINDING_SEVERITY_WARNING);
    f.set_summary(absl::StrFormat(
        "micro_batch %d is predicted to use %.0f%% of the device memory: too close to the limit",
        in.layout.micro_batch, 100 * now / device));
    f.set_fix("lower parallelism.micro_batch (with more micro-batches per step)");
  } else if (largest != nullptr) {
    f.set_summary(absl::StrFormat(
        "micro_batch %d uses %.0f%% of the device memory (predicted); micro_batch %d fits with "
        "margin (%.0f%%)",
        in.layout.micro_batch, 100 * now / device, largest->micro_batch,
        100 * static_cast<double>(largest->predicted_peak_bytes) / device));
    f.set_fix(absl::StrFormat(
        "raise parallelism.micro_batch to %d (predicted peak %.0f MiB of %.0f)",
        largest->micro_batch, static_cast<double>(largest->predicted_peak_bytes) / 1048576.0,
        device / 1048576.0));
    AddEvidence(&f, "proposed_micro_batch", largest->micro_batch, "memory model");
    AddEvidence(&f, "proposed_predicted_peak_bytes",
                static_cast<double>(largest->predicted_peak_bytes), "memory model");
  } else {
    return;
  }
  AddEvidence(&f, "micro_batch", in.layout.micro_batch, "Job.layout.micro_batch");
  AddEvidence(&f, "predicted_peak_bytes", now, "memory model");
  AddEvidence(&f, "device_memory_bytes", device, "node inventory");
  out->findings.push_back(std::move(f));
}

void NoProfile(const DoctorInput& in, const std::vector<RankFigures>& ranks, int64_t newest,
               Diagnosis* out) {
  const int world = in.layout.data * in.layout.tensor * in.layout.pipeline;
  std::map<int, const RankFigures*> by_rank;
  for (const RankFigures& r : ranks) by_rank[r.rank] = &r;
  for (int rank = 0; rank < world; ++rank) {
    auto it = by_rank.find(rank);
    std::string why;
    if (it == by_rank.end()) {
      why = "sends no step reports";
    } else if (it->second->steps >= kMinSteps && !it->second->has_phases) {
      why = "sends steps without phase data (phase_seconds)";
    } else if (newest - it->second->last_step > in.thresholds.stale_steps) {
      why =
          absl::StrFormat("is %d steps behind rank 0 (stale data)", newest - it->second->last_step);
    } else {
      continue;
    }
    v1::Finding f =
        NewFinding(v1::NO_PROFILE, v1::FINDING_SEVERITY_WARNING, RankSubject(rank, in.rank_nodes));
    f.set_rank(rank);
    f.set_stage(PositionOf(rank, in.layout).stage);
    if (auto n = in.rank_nodes.find(rank); n != in.rank_nodes.end()) f.set_node(n->second);
    f.set_summary(absl::StrCat("rank ", rank, " ", why,
                               ": its imbalance, stragglers and "
                               "communication cannot be judged"));
    AddEvidence(&f, "last_step", it == by_rank.end() ? -1.0 : it->second->last_step,
                "StepReport.step");
    AddEvidence(&f, "rank0_last_step", static_cast<double>(newest), "StepReport.step");
    f.set_fix(
        "run a rank program that prints the progress line's phases (docs/rank-contract.md); "
        "loom-train does");
    out->findings.push_back(std::move(f));
  }
}

}  // namespace

std::vector<int> EvenSplit(int layers, int stages) {
  std::vector<int> split;
  if (stages < 1) return split;
  for (int s = 0; s < stages; ++s) split.push_back(layers / stages + (s < layers % stages ? 1 : 0));
  return split;
}

Diagnosis Diagnose(const DoctorInput& in) {
  Diagnosis out;
  if (in.window == nullptr) return out;
  LayoutInfo l = in.layout;
  l.data = std::max(l.data, 1);
  l.tensor = std::max(l.tensor, 1);
  l.pipeline = std::max(l.pipeline, 1);
  DoctorInput input = in;
  input.layout = l;

  std::vector<RankFigures> ranks;
  for (const auto& [rank, w] : in.window->ranks()) ranks.push_back(FiguresOf(rank, w, l));
  const RankFigures* rank0 = nullptr;
  for (const RankFigures& r : ranks) {
    if (r.rank == 0) rank0 = &r;
  }
  if (rank0 == nullptr || rank0->steps < kMinSteps) return out;  // nothing to judge yet
  out.judged = true;
  out.step_seconds = rank0->step;

  const std::vector<int> split = l.blocks_per_stage.size() == static_cast<size_t>(l.pipeline)
                                     ? l.blocks_per_stage
                                     : EvenSplit(l.layers, l.pipeline);
  for (int s = 0; s < l.pipeline; ++s) {
    v1::StageReport st;
    st.set_stage(s);
    st.set_blocks(s < static_cast<int>(split.size()) ? split[static_cast<size_t>(s)] : 0);
    out.stages.push_back(st);
  }
  for (const RankFigures& r : ranks) {
    v1::RankReport rr;
    rr.set_rank(r.rank);
    rr.set_stage(r.pos.stage);
    if (auto it = in.rank_nodes.find(r.rank); it != in.rank_nodes.end()) rr.set_node(it->second);
    rr.set_step_seconds(r.step);
    rr.set_busy_seconds(r.busy);
    rr.set_idle_ratio(r.idle);
    rr.set_straggler_score(1.0);
    out.ranks.push_back(rr);
  }

  NoProfile(input, ranks, rank0->last_step, &out);
  StageImbalance(input, ranks, rank0->step, &out);
  Stragglers(input, ranks, &out);
  // Ranks waiting on a straggler show that wait as exposed communication: it is the straggler's
  // cost, named by its own finding, not the network's.
  const bool straggler =
      std::any_of(out.findings.begin(), out.findings.end(),
                  [](const v1::Finding& f) { return f.kind() == v1::STRAGGLER; });
  if (!straggler) ExposedCommunication(input, ranks, rank0->step, &out);
  Layout(input, rank0->step, &out);
  Memory(input, ranks, &out);
  return out;
}

}  // namespace loom::doctor
