// The doctor's pure parts (server/doctor): robust statistics, the telemetry window, every rule
// from recorded windows (including the cases that must not fire) and the finding tracker's
// persistence and hysteresis.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/doctor/finding_tracker.h"
#include "server/doctor/rules.h"
#include "server/doctor/stats.h"
#include "server/doctor/telemetry_window.h"

namespace loom::doctor {
namespace {

// A deterministic jitter in [-amplitude, +amplitude] (a small LCG: the same windows every run).
class Jitter {
 public:
  explicit Jitter(double amplitude) : amplitude_(amplitude) {}
  double operator()() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(state_ >> 11) / 9007199254740992.0;  // [0, 1)
    return 1.0 + amplitude_ * (2.0 * u - 1.0);
  }

 private:
  double amplitude_;
  uint64_t state_ = 12345;
};

// One rank's step as loom-train reports it.
struct StepFigures {
  double forward = 0.02, backward = 0.04, optimizer = 0.005, data = 0.001;
  double comm_exposed = 0.0, bubble = 0.0;
  double overlap = 0.0;
  uint64_t memory = 100 << 20, reserved = 100 << 20;
  double fragmentation = 0.0;
  uint64_t device_allocations = 0;
  uint64_t dp_bytes = 0;  // comm_bytes["all_reduce"]
};

v1::StepReport Report(int rank, int64_t step, const StepFigures& f, double scale = 1.0) {
  v1::StepReport r;
  r.set_rank(rank);
  r.set_step(step);
  auto& p = *r.mutable_phase_seconds();
  p["forward"] = f.forward * scale;
  p["backward"] = f.backward * scale;
  p["optimizer"] = f.optimizer * scale;
  p["data"] = f.data * scale;
  p["comm_exposed"] = f.comm_exposed;
  p["bubble"] = f.bubble;
  const double step_s =
      (f.forward + f.backward + f.optimizer + f.data) * scale + f.comm_exposed + f.bubble;
  r.set_step_seconds(step_s);
  r.set_idle_ratio((f.comm_exposed + f.bubble) / step_s);
  r.set_overlap_ratio(f.overlap);
  if (f.dp_bytes > 0) (*r.mutable_comm_bytes())["all_reduce"] = f.dp_bytes;
  r.set_memory_bytes(f.memory);
  r.set_reserved_memory_bytes(f.reserved);
  r.set_memory_fragmentation(f.fragmentation);
  r.set_device_allocations(f.device_allocations);
  r.set_device(f.reserved != f.memory ? "cuda:0" : "cpu");
  return r;
}

// Block costs of a stage holding blocks [first, first + n) of a model with `layers` blocks.
void AddBlocks(v1::StepReport* r, int first, int n, int layers, double block, double embedding,
               double head) {
  v1::BlockCosts* c = r->mutable_block_costs();
  c->set_first_block(first);
  for (int i = 0; i < n; ++i) {
    c->add_forward_seconds(block / 3);
    c->add_backward_seconds(2 * block / 3);
  }
  if (first == 0) {
    c->set_has_embedding(true);
    c->set_embedding_forward_seconds(embedding / 2);
    c->set_embedding_backward_seconds(embedding / 2);
  }
  if (first + n == layers) {
    c->set_has_head(true);
    c->set_head_forward_seconds(head / 3);
    c->set_head_backward_seconds(2 * head / 3);
  }
}

// The first finding of `kind` (a copy: the diagnosis may be a temporary).
std::optional<v1::Finding> Find(const Diagnosis& d, v1::FindingKind kind) {
  for (const v1::Finding& f : d.findings) {
    if (f.kind() == kind) return f;
  }
  return std::nullopt;
}

TEST(DoctorStatsTest, MedianAndMadIgnoreOutliers) {
  EXPECT_DOUBLE_EQ(Median({}), 0.0);
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Median({1, 1, 1, 1000}), 1.0);
  EXPECT_DOUBLE_EQ(Mad({5}), 0.0);
  EXPECT_NEAR(Mad({1, 2, 3, 4, 1000}), 1.4826, 1e-9);
}

TEST(TelemetryWindowTest, SkipsWarmupResentAndBadReportsAndStaysBounded) {
  TelemetryWindow w;
  StepFigures f;
  EXPECT_FALSE(w.Add(Report(0, 1, f)));  // warmup
  EXPECT_FALSE(w.Add(Report(0, 2, f)));  // warmup
  EXPECT_TRUE(w.Add(Report(0, 3, f)));
  EXPECT_FALSE(w.Add(Report(0, 3, f)));  // re-sent
  v1::StepReport eval = Report(0, 4, f);
  eval.set_has_val_loss(true);
  EXPECT_FALSE(w.Add(eval));
  v1::StepReport bad = Report(0, 5, f);
  bad.set_step_seconds(0);
  EXPECT_FALSE(w.Add(bad));
  for (int s = 6; s < 60; ++s) {
    v1::StepReport r = Report(0, s, f);
    AddBlocks(&r, 0, 2, 2, 0.01, 0.001, 0.02);
    w.Add(r);
  }
  EXPECT_EQ(w.ranks().at(0).steps.size(), static_cast<size_t>(TelemetryWindow::kMaxSteps));
  EXPECT_EQ(w.ranks().at(0).blocks.size(), static_cast<size_t>(TelemetryWindow::kMaxBlockSamples));
  EXPECT_EQ(w.newest_step(), 59);
  EXPECT_NEAR(w.ranks().at(0).blocks.back().seconds[1], 0.01, 1e-12);
}

// A pipeline of 4 stages over 8 blocks, evenly split, whose head (3 blocks' worth) makes the last
// stage the bottleneck; the first three stages wait (bubble).
struct PipelineCase {
  LayoutInfo layout;
  TelemetryWindow window;
};

PipelineCase HeadHeavyPipeline(double head_cost, double jitter) {
  PipelineCase c;
  c.layout.pipeline = 4;
  c.layout.layers = 8;
  c.layout.num_micro_batches = 4;
  const double block = 0.01, embedding = 0.001;
  Jitter j(jitter);
  for (int step = 1; step <= 20; ++step) {
    for (int stage = 0; stage < 4; ++stage) {
      StepFigures f;
      const double busy = 2 * block + (stage == 0 ? embedding : 0) + (stage == 3 ? head_cost : 0);
      f.forward = busy / 3;
      f.backward = 2 * busy / 3;
      f.optimizer = f.data = 0;
      const double slowest = 2 * block + head_cost;
      f.bubble = std::max(0.0, slowest - busy) + 0.001;
      v1::StepReport r = Report(stage, step, f, j());
      if (step % 4 == 0) AddBlocks(&r, 2 * stage, 2, 8, block * j(), embedding, head_cost * j());
      c.window.Add(r);
    }
  }
  return c;
}

TEST(DoctorRulesTest, StageImbalanceNamesTheLastStageWithAMeasuredSplit) {
  PipelineCase c = HeadHeavyPipeline(/*head_cost=*/0.03, /*jitter=*/0.02);
  DoctorInput in;
  in.layout = c.layout;
  in.window = &c.window;
  const Diagnosis d = Diagnose(in);
  ASSERT_TRUE(d.judged);
  const std::optional<v1::Finding> f = Find(d, v1::STAGE_IMBALANCE);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->stage(), 3);
  EXPECT_EQ(f->subject(), "stage 3");
  // Stage costs now (blocks 0.01, head 0.03): 0.021, 0.02, 0.02, 0.05; the best split keeps one
  // block with the head: bottleneck 0.04.
  ASSERT_EQ(f->blocks_per_stage_size(), 4);
  int sum = 0;
  for (int b : f->blocks_per_stage()) sum += b;
  EXPECT_EQ(sum, 8);
  EXPECT_EQ(f->blocks_per_stage(3), 1);
  // 4 micro-batches: the step saves 3/4 of the bottleneck's 0.01 s (fill and drain stay).
  EXPECT_NEAR(f->predicted_gain(), 0.75 * 0.01 / d.step_seconds, 0.01);
  EXPECT_GT(f->predicted_gain(), 0.1);
  EXPECT_NEAR(f->predicted_step_seconds(), d.step_seconds - 0.0075, 0.001);
  EXPECT_NE(f->fix().find("parallelism.blocks_per_stage: ["), std::string::npos) << f->fix();
  bool has_ratio = false;
  for (const auto& e : f->evidence()) {
    if (e.name() == "imbalance_ratio") {
      has_ratio = true;
      EXPECT_GT(e.value(), 1.5);
      EXPECT_EQ(e.series(), "loom_job_stage_imbalance_ratio");
    }
  }
  EXPECT_TRUE(has_ratio);
  ASSERT_EQ(d.stages.size(), 4u);
  EXPECT_GT(d.stages[0].idle_ratio(), 0.3);  // the waiting stages
  EXPECT_LT(d.stages[3].idle_ratio(), 0.1);
  // No straggler (dp = 1), no exposed communication (bubble is not communication).
  EXPECT_FALSE(Find(d, v1::STRAGGLER).has_value());
  EXPECT_FALSE(Find(d, v1::EXPOSED_COMMUNICATION).has_value());
}

// With one micro-batch per step the stages run one after another: moving blocks does not
// shorten the step, so the finding names the bottleneck but proposes no split.
TEST(DoctorRulesTest, OneMicroBatchGetsNoSplitButTheAdviceToUseMore) {
  PipelineCase c = HeadHeavyPipeline(/*head_cost=*/0.03, /*jitter=*/0.0);
  DoctorInput in;
  in.layout = c.layout;
  in.layout.num_micro_batches = 1;
  in.window = &c.window;
  const std::optional<v1::Finding> f = Find(Diagnose(in), v1::STAGE_IMBALANCE);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->stage(), 3);
  EXPECT_EQ(f->blocks_per_stage_size(), 0);
  EXPECT_DOUBLE_EQ(f->predicted_gain(), 0.0);
  EXPECT_NE(f->fix().find("one micro-batch"), std::string::npos) << f->fix();
  EXPECT_NE(f->fix().find("parallelism.micro_batch"), std::string::npos) << f->fix();
}

TEST(DoctorRulesTest, BalancedPipelineWithJitterRaisesNothingOverALongRun) {
  // Blocks alike, no head cost worth a block: the even split is right; 5 % jitter per step.
  PipelineCase c = HeadHeavyPipeline(/*head_cost=*/0.0005, /*jitter=*/0.05);
  TrackerState state;
  for (int window = 0; window < 50; ++window) {
    DoctorInput in;
    in.layout = c.layout;
    in.window = &c.window;
    in.raised = state.RaisedKeys();
    const Diagnosis d = Diagnose(in);
    ASSERT_TRUE(d.judged);
    ASSERT_EQ(d.stages.size(), 4u);
    EXPECT_GT(d.stages[3].busy_seconds(), 0.0);  // the rule ran over measured stages
    EXPECT_FALSE(Find(d, v1::STAGE_IMBALANCE).has_value());
    TrackerUpdate u = Track(std::move(state), d.findings);
    EXPECT_TRUE(u.raised.empty()) << u.raised[0].summary();
    state = std::move(u.state);
    // The next window: more steps with fresh jitter.
    PipelineCase next = HeadHeavyPipeline(0.0005, 0.05 + 0.001 * window);
    c.window = next.window;
  }
}

TEST(DoctorRulesTest, ImbalanceWithoutBlockSamplesStillNamesTheStage) {
  PipelineCase c = HeadHeavyPipeline(0.03, 0.0);
  // The same pipeline without block costs.
  TelemetryWindow stripped;
  for (int step = 1; step <= 20; ++step) {
    for (int stage = 0; stage < 4; ++stage) {
      StepFigures f;
      f.forward = stage == 3 ? 0.05 : 0.02;
      f.backward = f.optimizer = f.data = 0;
      f.bubble = stage == 3 ? 0 : 0.03;
      stripped.Add(Report(stage, step, f));
    }
  }
  DoctorInput in;
  in.layout = c.layout;
  in.window = &stripped;
  const std::optional<v1::Finding> f = Find(Diagnose(in), v1::STAGE_IMBALANCE);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->blocks_per_stage_size(), 0);
  EXPECT_NE(f->fix().find("per-block samples"), std::string::npos);
}

// Issue 12's reference layout, data 2 x pipeline 4, 8 blocks split [2, 2, 2, 2], with a head
// worth 5.6 blocks; all 8 ranks on nodes/n1. Busy per stage 0.21, 0.2, 0.2, 0.76 s of a 0.81 s
// step: the ranks' busy time is 2.74 s per step.
PipelineCase ReferencePipeline() {
  PipelineCase c;
  c.layout.data = 2;
  c.layout.pipeline = 4;
  c.layout.layers = 8;
  c.layout.num_micro_batches = 4;
  const double block = 0.1, embedding = 0.01, head = 0.56, step_seconds = 0.81;
  for (int step = 1; step <= 20; ++step) {
    for (int rank = 0; rank < 8; ++rank) {
      const int stage = rank / 2;  // rank = dp + 2 * stage
      StepFigures f;
      const double busy = 2 * block + (stage == 0 ? embedding : 0) + (stage == 3 ? head : 0);
      f.forward = busy / 3;
      f.backward = 2 * busy / 3;
      f.optimizer = f.data = 0;
      f.bubble = step_seconds - busy;
      v1::StepReport r = Report(rank, step, f);
      if (step % 4 == 0) AddBlocks(&r, 2 * stage, 2, 8, block, embedding, head);
      c.window.Add(r);
    }
  }
  return c;
}

// CPU devices share their node's cores: where this job's ranks outnumber a node's cores and keep
// them busy for the whole step, moving blocks cannot shorten the step (the node's total work
// sets it), so no split is proposed and `auto` does not restart the job for nothing. Where the
// cores are not full, or are enough, or are not known (a GPU job), the measured split stands.
TEST(DoctorRulesTest, NoSplitWhereTheRanksKeepTheirNodesCoresFull) {
  PipelineCase c = ReferencePipeline();
  DoctorInput in;
  in.layout = c.layout;
  in.window = &c.window;
  for (int rank = 0; rank < 8; ++rank) in.rank_nodes[rank] = "nodes/n1";

  in.node_cpu_cores["nodes/n1"] = 2;  // 8 ranks, busy 2.74 s = 1.69 x 2 cores x 0.81 s
  std::optional<v1::Finding> f = Find(Diagnose(in), v1::STAGE_IMBALANCE);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->stage(), 3);
  EXPECT_EQ(f->blocks_per_stage_size(), 0);
  EXPECT_DOUBLE_EQ(f->predicted_gain(), 0.0);
  EXPECT_NE(f->fix().find("no re-split proposed: 8 ranks of this job share the 2 cores of "
                          "nodes/n1"),
            std::string::npos)
      << f->fix();
  double load = 0;
  for (const auto& e : f->evidence()) {
    if (e.name() == "nodes/n1 busy_per_core_step") load = e.value();
  }
  EXPECT_NEAR(load, 2.74 / (2 * 0.81), 1e-6);

  for (int cores : {4, 8, 0}) {  // not full (0.85x), enough cores, unknown
    in.node_cpu_cores["nodes/n1"] = cores;
    f = Find(Diagnose(in), v1::STAGE_IMBALANCE);
    ASSERT_TRUE(f.has_value()) << cores;
    EXPECT_EQ(f->blocks_per_stage_size(), 4) << cores << ": " << f->fix();
    EXPECT_GT(f->predicted_gain(), 0.05) << cores;
  }
  in.node_cpu_cores.clear();  // a GPU job
  f = Find(Diagnose(in), v1::STAGE_IMBALANCE);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->blocks_per_stage_size(), 4);
}

// dp = 4, one stage: rank 2 computes `slow`x as long; the others wait for it in the all-reduce.
TelemetryWindow DataParallel(double slow, double everyone, double jitter) {
  TelemetryWindow w;
  Jitter j(jitter);
  for (int step = 1; step <= 20; ++step) {
    for (int rank = 0; rank < 4; ++rank) {
      StepFigures f;
      const double factor = everyone * (rank == 2 ? slow : 1.0);
      const double busy = (f.forward + f.backward + f.optimizer + f.data) * everyone * slow;
      f.comm_exposed = rank == 2 ? 0.001 : busy * (1 - 1 / slow) + 0.001;
      f.overlap = 0.9;
      w.Add(Report(rank, step, f, factor * j()));
    }
  }
  return w;
}

TEST(DoctorRulesTest, StragglerIsNamedWithItsNode) {
  TelemetryWindow w = DataParallel(/*slow=*/1.6, /*everyone=*/1.0, /*jitter=*/0.03);
  DoctorInput in;
  in.layout.data = 4;
  in.layout.layers = 2;
  in.window = &w;
  in.rank_nodes = {{0, "nodes/a"}, {1, "nodes/a"}, {2, "nodes/b"}, {3, "nodes/b"}};
  const Diagnosis d = Diagnose(in);
  int stragglers = 0;
  for (const v1::Finding& f : d.findings) {
    if (f.kind() != v1::STRAGGLER) continue;
    ++stragglers;
    EXPECT_EQ(f.rank(), 2);
    EXPECT_EQ(f.node(), "nodes/b");
    EXPECT_EQ(f.subject(), "rank 2 (nodes/b)");
    EXPECT_NE(f.summary().find("on nodes/b"), std::string::npos) << f.summary();
  }
  EXPECT_EQ(stragglers, 1);
  ASSERT_EQ(d.ranks.size(), 4u);
  EXPECT_NEAR(d.ranks[2].straggler_score(), 1 / 1.6, 0.05);
  EXPECT_NEAR(d.ranks[0].straggler_score(), 1.0, 0.05);
  // The others' wait is the straggler's cost, not exposed communication.
  EXPECT_FALSE(Find(d, v1::EXPOSED_COMMUNICATION).has_value());
}

TEST(DoctorRulesTest, JobWideSlowdownAndJitterAreNotStragglers) {
  for (double everyone : {1.0, 2.0}) {
    TelemetryWindow w = DataParallel(/*slow=*/1.0, everyone, /*jitter=*/0.08);
    DoctorInput in;
    in.layout.data = 4;
    in.window = &w;
    const Diagnosis d = Diagnose(in);
    EXPECT_TRUE(d.judged);
    EXPECT_FALSE(Find(d, v1::STRAGGLER).has_value()) << "everyone x" << everyone;
  }
}

TEST(DoctorRulesTest, StragglerKeepThresholdIsLowerThanRaise) {
  // 1.18x: under the raise threshold (1.25), over the keep threshold (1.12).
  TelemetryWindow w = DataParallel(1.18, 1.0, 0.0);
  DoctorInput in;
  in.layout.data = 4;
  in.window = &w;
  EXPECT_FALSE(Find(Diagnose(in), v1::STRAGGLER).has_value());
  in.raised = {"STRAGGLER|rank 2"};
  EXPECT_TRUE(Find(Diagnose(in), v1::STRAGGLER).has_value());
}

// A job that takes a bucket fix is not told to undo it: from buckets far too small and from
// buckets far too large, for gradients from 1 MiB to 6 GiB a step, the advised size gives a
// window whose fix (if the wait stays) no longer names dp_bucket_mb. Before, 0.01 MiB buckets
// were told "25 (the default)", and a small model at 25 MiB was then told "smaller".
TEST(DoctorRulesTest, ExposedCommunicationBucketAdviceNeverSwingsBack) {
  for (const uint64_t dp_bytes :
       {uint64_t{1} << 20, uint64_t{4} << 20, uint64_t{500} << 20, uint64_t{6} << 30}) {
    TelemetryWindow w;
    for (int step = 1; step <= 10; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        StepFigures f;
        f.comm_exposed = 0.03;  // 30 % of the step: raised whatever the bucket size
        f.overlap = 0.1;
        f.dp_bytes = dp_bytes;
        w.Add(Report(rank, step, f));
      }
    }
    const double mib = static_cast<double>(dp_bytes) / 1048576.0;
    for (const double start_mb : {mib / 1000, mib}) {
      SCOPED_TRACE(absl::StrCat(mib, " MiB of gradients in buckets of ", start_mb, " MiB"));
      DoctorInput in;
      in.layout.data = 2;
      in.layout.dp_bucket_mb = start_mb;
      in.window = &w;
      const std::optional<v1::Finding> first = Find(Diagnose(in), v1::EXPOSED_COMMUNICATION);
      ASSERT_TRUE(first.has_value());
      const std::string key = "set spec.parallelism.dp_bucket_mb to ";
      const size_t at = first->fix().find(key);
      ASSERT_NE(at, std::string::npos) << first->fix();
      const double advised = std::stod(first->fix().substr(at + key.size()));
      EXPECT_GT(advised, 0);
      EXPECT_LE(advised, 1024);
      // Larger from too small, smaller from too large.
      EXPECT_EQ(advised > start_mb, start_mb < mib / 64) << first->fix();
      in.layout.dp_bucket_mb = advised;
      const std::optional<v1::Finding> next = Find(Diagnose(in), v1::EXPOSED_COMMUNICATION);
      ASSERT_TRUE(next.has_value());  // the wait is the same in this window
      EXPECT_EQ(next->fix().find("dp_bucket_mb"), std::string::npos) << next->fix();
      EXPECT_NE(next->fix().find("less data-parallel traffic"), std::string::npos) << next->fix();
    }
  }
}

TEST(DoctorRulesTest, ExposedCommunicationWithItsFix) {
  TelemetryWindow w;
  for (int step = 1; step <= 10; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      StepFigures f;
      f.comm_exposed = 0.03;  // 30 % of a 0.096 s step
      f.overlap = 0.1;
      f.dp_bytes = 4 << 20;  // the gradients of a 1 Mi-parameter model
      w.Add(Report(rank, step, f));
    }
  }
  DoctorInput in;
  in.layout.data = 2;
  in.window = &w;
  const std::optional<v1::Finding> f = Find(Diagnose(in), v1::EXPOSED_COMMUNICATION);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->subject(), "job");
  // Overlap on, 25 MiB buckets (one per step here), little overlap: start earlier, with the
  // 4 MiB of gradients in 8 buckets.
  EXPECT_NE(f->fix().find("set spec.parallelism.dp_bucket_mb to 0.5 (8 all-reduces per step)"),
            std::string::npos)
      << f->fix();
  EXPECT_NEAR(f->predicted_gain(), 0.03 / 0.096, 0.01);

  // The fix names the spec field that causes it: overlap turned off...
  in.layout.dp_overlap = false;
  std::optional<v1::Finding> g = Find(Diagnose(in), v1::EXPOSED_COMMUNICATION);
  ASSERT_TRUE(g.has_value());
  EXPECT_NE(g->fix().find("set spec.parallelism.dp_overlap to true"), std::string::npos)
      << g->fix();
  // ... or buckets so small that their latencies add up: 4 MiB in 0.01 MiB buckets is 400
  // all-reduces per step.
  in.layout.dp_overlap = true;
  in.layout.dp_bucket_mb = 0.01;
  g = Find(Diagnose(in), v1::EXPOSED_COMMUNICATION);
  ASSERT_TRUE(g.has_value());
  EXPECT_NE(g->fix().find("400 all-reduces of 0.01 MiB per step"), std::string::npos) << g->fix();
  EXPECT_NE(g->fix().find("set spec.parallelism.dp_bucket_mb to 0.5 "), std::string::npos)
      << g->fix();
  in.layout.dp_bucket_mb = 25;

  TelemetryWindow low;
  for (int step = 1; step <= 10; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      StepFigures g;
      g.comm_exposed = 0.005;  // 7 %
      g.overlap = 0.8;
      low.Add(Report(rank, step, g));
    }
  }
  in.window = &low;
  EXPECT_FALSE(Find(Diagnose(in), v1::EXPOSED_COMMUNICATION).has_value());
}

TEST(DoctorRulesTest, LayoutWorseThanThePlannersBestByMoreThanTheThreshold) {
  TelemetryWindow w;
  for (int step = 1; step <= 10; ++step) w.Add(Report(0, step, StepFigures{}));
  const double measured = 0.066;
  DoctorInput in;
  in.window = &w;
  LayoutAdvice a;
  a.best.set_data(1);
  a.best.set_pipeline(2);
  a.best.set_micro_batch(4);
  a.current_predicted_step_seconds = 0.033;  // the job runs 2x slower than predicted
  a.best_predicted_step_seconds = 0.022;     // calibrated: 0.044, 33 % faster
  in.layout_advice = a;
  const std::optional<v1::Finding> f = Find(Diagnose(in), v1::LAYOUT);
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->predicted_step_seconds(), 0.044, 1e-3);
  EXPECT_NEAR(f->predicted_gain(), 1 - 0.044 / measured, 0.01);
  EXPECT_EQ(f->layout().pipeline(), 2);
  EXPECT_NE(f->fix().find("pipeline=2"), std::string::npos);
  a.best_predicted_step_seconds = 0.030;  // 9 % faster: under the threshold
  in.layout_advice = a;
  EXPECT_FALSE(Find(Diagnose(in), v1::LAYOUT).has_value());
}

TEST(DoctorRulesTest, MemoryFragmentationAndHeadroom) {
  // A shape that changes from step to step: the unused bytes move with it.
  TelemetryWindow frag;
  for (int step = 1; step <= 10; ++step) {
    StepFigures f;
    f.memory = (step % 2 == 0 ? 200ull : 150ull) << 20;
    f.reserved = 400ull << 20;
    f.fragmentation = 0.7;
    frag.Add(Report(0, step, f));
  }
  DoctorInput in;
  in.window = &frag;
  const std::optional<v1::Finding> f = Find(Diagnose(in), v1::MEMORY);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank(), 0);
  EXPECT_NE(f->summary().find("fragmented"), std::string::npos);

  // The same unused 200 MiB every step is the cache's fixed rounding: not raised while the
  // device has room, raised once the rank reserves 90 % of it.
  TelemetryWindow flat;
  for (int step = 1; step <= 10; ++step) {
    StepFigures g;
    g.memory = 200ull << 20;
    g.reserved = 400ull << 20;
    g.fragmentation = 0.7;
    flat.Add(Report(0, step, g));
  }
  DoctorInput roomy;
  roomy.window = &flat;
  EXPECT_FALSE(Find(Diagnose(roomy), v1::MEMORY).has_value());
  roomy.device_memory_bytes = 4000ull << 20;
  EXPECT_FALSE(Find(Diagnose(roomy), v1::MEMORY).has_value());
  roomy.device_memory_bytes = 440ull << 20;
  const std::optional<v1::Finding> pressed = Find(Diagnose(roomy), v1::MEMORY);
  ASSERT_TRUE(pressed.has_value());
  EXPECT_NE(pressed->summary().find("fragmented"), std::string::npos);

  // A clean allocator: no fragmentation finding; headroom from the memory model.
  TelemetryWindow clean;
  for (int step = 1; step <= 10; ++step) clean.Add(Report(0, step, StepFigures{}));
  in.window = &clean;
  EXPECT_FALSE(Find(Diagnose(in), v1::MEMORY).has_value());
  in.layout.micro_batch = 2;
  in.device_memory_bytes = 1000;
  in.micro_batch_fits = {{2, 200}, {4, 400}, {8, 790}, {16, 1500}};
  const std::optional<v1::Finding> head = Find(Diagnose(in), v1::MEMORY);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->severity(), v1::FINDING_SEVERITY_INFO);
  EXPECT_NE(head->fix().find("raise parallelism.micro_batch to 8"), std::string::npos)
      << head->fix();
  in.micro_batch_fits = {{2, 960}};
  const std::optional<v1::Finding> near = Find(Diagnose(in), v1::MEMORY);
  ASSERT_TRUE(near.has_value());
  EXPECT_NE(near->fix().find("lower parallelism.micro_batch"), std::string::npos);
  in.micro_batch_fits = {{2, 700}, {4, 900}};  // nothing larger fits with margin, not near
  EXPECT_FALSE(Find(Diagnose(in), v1::MEMORY).has_value());
}

TEST(DoctorRulesTest, NoProfileForSilentStaleOrPhaselessRanks) {
  TelemetryWindow w;
  for (int step = 1; step <= 60; ++step) {
    w.Add(Report(0, step, StepFigures{}));
    if (step <= 10) w.Add(Report(1, step, StepFigures{}));  // then silent: stale
    v1::StepReport bare;                                    // rank 2: steps without phases
    bare.set_rank(2);
    bare.set_step(step);
    bare.set_step_seconds(0.07);
    w.Add(bare);
  }  // rank 3: nothing at all
  DoctorInput in;
  in.layout.data = 4;
  in.window = &w;
  std::vector<int> named;
  for (const v1::Finding& f : Diagnose(in).findings) {
    if (f.kind() == v1::NO_PROFILE) named.push_back(f.rank());
  }
  EXPECT_EQ(named, (std::vector<int>{1, 2, 3}));

  TelemetryWindow healthy;
  for (int step = 1; step <= 10; ++step) {
    for (int rank = 0; rank < 4; ++rank) healthy.Add(Report(rank, step, StepFigures{}));
  }
  in.window = &healthy;
  const Diagnosis d = Diagnose(in);
  EXPECT_TRUE(d.judged);
  EXPECT_TRUE(d.findings.empty()) << d.findings[0].summary();
}

TEST(DoctorRulesTest, NothingJudgedBeforeEnoughSteps) {
  TelemetryWindow w;
  for (int step = 1; step <= 4; ++step) w.Add(Report(0, step, StepFigures{}));  // 2 kept
  DoctorInput in;
  in.window = &w;
  EXPECT_FALSE(Diagnose(in).judged);
}

v1::Finding Observed(v1::FindingKind kind, const std::string& subject) {
  v1::Finding f;
  f.set_kind(kind);
  f.set_subject(subject);
  return f;
}

TEST(FindingTrackerTest, RaisesAfterPersistenceAndClearsWithHysteresis) {
  const v1::Finding s = Observed(v1::STRAGGLER, "rank 2");
  TrackerState state;
  for (int i = 0; i < 2; ++i) {
    TrackerUpdate u = Track(std::move(state), {s});
    EXPECT_TRUE(u.raised.empty());
    state = std::move(u.state);
  }
  TrackerUpdate third = Track(std::move(state), {s});
  ASSERT_EQ(third.raised.size(), 1u);
  EXPECT_EQ(third.raised[0].windows(), 3);
  state = std::move(third.state);
  EXPECT_EQ(state.RaisedKeys(), (std::set<std::string>{"STRAGGLER|rank 2"}));
  // Absent twice, back: still raised, nothing cleared or raised again.
  for (int i = 0; i < 2; ++i) {
    TrackerUpdate u = Track(std::move(state), {});
    EXPECT_TRUE(u.cleared.empty());
    state = std::move(u.state);
  }
  TrackerUpdate back = Track(std::move(state), {s});
  EXPECT_TRUE(back.raised.empty());
  EXPECT_TRUE(back.cleared.empty());
  state = std::move(back.state);
  // Absent three windows in a row: cleared once.
  int cleared = 0;
  for (int i = 0; i < 3; ++i) {
    TrackerUpdate u = Track(std::move(state), {});
    cleared += static_cast<int>(u.cleared.size());
    state = std::move(u.state);
  }
  EXPECT_EQ(cleared, 1);
  EXPECT_TRUE(state.entries.empty());
}

TEST(FindingTrackerTest, AnIntermittentFindingNeverRaises) {
  const v1::Finding f = Observed(v1::EXPOSED_COMMUNICATION, "job");
  TrackerState state;
  for (int i = 0; i < 100; ++i) {
    TrackerUpdate u = Track(std::move(state),
                            i % 3 == 2 ? std::vector<v1::Finding>{} : std::vector<v1::Finding>{f});
    EXPECT_TRUE(u.raised.empty()) << "window " << i;
    state = std::move(u.state);
  }
  EXPECT_EQ(state.windows, 100);
}

TEST(DoctorNamesTest, KindsAndSeverities) {
  EXPECT_EQ(KindName(v1::STAGE_IMBALANCE), "STAGE_IMBALANCE");
  EXPECT_EQ(KindName(v1::NO_PROFILE), "NO_PROFILE");
  EXPECT_EQ(SeverityName(v1::FINDING_SEVERITY_CRITICAL), "critical");
  EXPECT_EQ(EvenSplit(10, 4), (std::vector<int>{3, 3, 2, 2}));
}

}  // namespace
}  // namespace loom::doctor
