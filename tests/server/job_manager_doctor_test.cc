// The doctor inside the JobManager (no network): step reports of a running job fill its window,
// the tick judges it every few steps, a persistent finding is raised as a job event carrying the
// finding, served by GetJobReport and exported as loom_job_finding / loom_rank_straggler_score,
// and the series go when the job ends.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
#include "server/metrics/server_metrics.h"
#include "server/store/job_store.h"
#include "tests/server/loomd_test_util.h"
#include "tests/server/store_test_util.h"

namespace loom::jobs {
namespace {

using ::loom::testing::CpuNode;
using ::loom::testing::CpuSpec;
using ::loom::testing::CreateRequest;
using ::loom::testing::FakeSink;
using ::loom::testing::RankExit;
using ::loom::testing::RankPhase;
using ::testing::HasSubstr;
using ::testing::Not;

class JobManagerDoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = store::NewMemoryJobStore();
    auto logs = LogStore::Open(dir_.File("logs"));
    ASSERT_TRUE(logs.ok()) << logs.status();
    logs_ = std::move(*logs);
    JobManagerOptions options;
    options.rendezvous_address = "loomd.test:7070";
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), logs_.get(),
                                      nullptr, &metrics_, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
    metrics_.SetSnapshotSource([this] { return manager_->MetricsSnapshot(); });
    ASSERT_TRUE(manager_->RegisterNode(CpuNode("n1", 2)).ok());
    sink_ = std::make_shared<FakeSink>();
    v1::SessionHello hello;
    hello.set_node_id("n1");
    absl::StatusOr<uint64_t> session = manager_->OpenSession(hello, sink_);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *session;
  }

  void Send(const v1::WorkerMessage& m) {
    absl::Status s = manager_->HandleWorkerMessage("n1", session_, m);
    ASSERT_TRUE(s.ok()) << s;
  }

  // A data-parallel job of 2 ranks on n1, RUNNING (or tensor-parallel with `tensor`).
  std::string RunningDataParallelJob(bool tensor = false) {
    v1::JobSpec spec = CpuSpec(2);
    spec.mutable_train()->set_steps(1000);
    if (tensor) {
      spec.mutable_parallelism()->set_tensor(2);
    } else {
      spec.mutable_parallelism()->set_data(2);
    }
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
    EXPECT_TRUE(job.ok()) << job.status();
    for (int r = 0; r < 2; ++r) Send(RankPhase(job->name(), 1, r, v1::RANK_PHASE_RUNNING));
    return job->name();
  }

  // One step of `rank` computing `busy` seconds; the other waits `wait` in the all-reduce.
  void SendStep(const std::string& job, int rank, int64_t step, double busy, double wait) {
    v1::WorkerMessage m;
    v1::StepReport* r = m.mutable_step();
    r->set_job(job);
    r->set_generation(1);
    r->set_rank(rank);
    r->set_step(step);
    r->set_total_steps(1000);
    r->set_step_seconds(busy + wait);
    (*r->mutable_phase_seconds())["forward"] = busy / 3;
    (*r->mutable_phase_seconds())["backward"] = 2 * busy / 3;
    (*r->mutable_phase_seconds())["comm_exposed"] = wait;
    r->set_idle_ratio(wait / (busy + wait));
    Send(m);
  }

  // `steps` more steps of both ranks, rank 1 computing `slow` times as long; a tick after each.
  void Steps(const std::string& job, int64_t* step, int steps, double slow) {
    for (int i = 0; i < steps; ++i, ++*step) {
      SendStep(job, 0, *step, 0.1, 0.1 * (slow - 1) + 0.001);
      SendStep(job, 1, *step, 0.1 * slow, 0.001);
      clock_.Advance(absl::Milliseconds(100));
      manager_->Tick();
    }
  }

  std::vector<v1::JobEvent> DoctorEvents(const std::string& job) {
    std::vector<v1::JobEvent> out;
    const absl::StatusOr<v1::Job> got = manager_->GetJob(job);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return out;
    for (const v1::JobEvent& e : got->events()) {
      if (e.has_finding()) out.push_back(e);
    }
    return out;
  }

  store::testing::TempDir dir_;
  FakeClock clock_;
  metrics::Registry registry_;
  server_metrics::ServerMetrics metrics_{&registry_};
  std::unique_ptr<store::JobStore> store_;
  std::unique_ptr<LogStore> logs_;
  std::unique_ptr<JobManager> manager_;
  std::shared_ptr<FakeSink> sink_;
  uint64_t session_ = 0;
};

TEST_F(JobManagerDoctorTest, AStragglerIsRaisedAsAnEventReportedAndExported) {
  const std::string job = RunningDataParallelJob();
  const std::string id = job.substr(5);
  absl::StatusOr<v1::JobReport> early = manager_->GetJobReport(job);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_THAT(early->note(), HasSubstr("waiting for steps"));

  int64_t step = 1;
  // Warmup (2) + kMinSteps (4) + 2 more windows of 4 steps: judged in 3 windows, not yet raised
  // before the third.
  Steps(job, &step, 2 + 4 + 4, 2.0);
  EXPECT_TRUE(DoctorEvents(job).empty());
  Steps(job, &step, 4, 2.0);
  std::vector<v1::JobEvent> events = DoctorEvents(job);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].finding_raised());
  EXPECT_EQ(events[0].finding().kind(), v1::STRAGGLER);
  EXPECT_EQ(events[0].finding().rank(), 1);
  EXPECT_EQ(events[0].finding().node(), "nodes/n1");
  EXPECT_THAT(events[0].reason(), HasSubstr("doctor: raised STRAGGLER (rank 1 (nodes/n1))"));

  absl::StatusOr<v1::JobReport> report = manager_->GetJobReport(job);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->generation(), 1);
  EXPECT_GE(report->windows(), 3);
  ASSERT_EQ(report->findings_size(), 1);
  EXPECT_EQ(report->findings(0).kind(), v1::STRAGGLER);
  ASSERT_EQ(report->ranks_size(), 2);
  EXPECT_NEAR(report->ranks(1).straggler_score(), 0.5, 0.01);

  std::string text = registry_.Serialize();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_finding{job=\"", id,
                                           "\",kind=\"STRAGGLER\",severity=\"warning\"} 1")));
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("loom_rank_straggler_score{job=\"", id, "\",rank=\"1\"} 0.5")));

  // The rank recovers: the finding clears after the hysteresis, once.
  Steps(job, &step, 4 * 4, 1.0);
  events = DoctorEvents(job);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[1].finding_raised());
  EXPECT_THAT(events[1].reason(), HasSubstr("doctor: cleared STRAGGLER"));
  text = registry_.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("loom_job_finding{")));

  ASSERT_TRUE(manager_->CancelJob(job).ok());
  text = registry_.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("loom_rank_straggler_score{")));
  report = manager_->GetJobReport(job);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->note(), HasSubstr("CANCELLED"));
  EXPECT_EQ(manager_->GetJobReport("jobs/nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->GetJobReport("bad").status().code(), absl::StatusCode::kInvalidArgument);
}

// The planner's advice reaches the rules: tensor parallelism over 2 CPU devices is predicted
// clearly slower than data parallelism, with the job's own calibration.
TEST_F(JobManagerDoctorTest, ALayoutWorseThanThePlannersBestIsRaised) {
  const std::string job = RunningDataParallelJob(/*tensor=*/true);
  int64_t step = 1;
  Steps(job, &step, 2 + 4 + 4 + 4, 1.0);
  absl::StatusOr<v1::JobReport> report = manager_->GetJobReport(job);
  ASSERT_TRUE(report.ok());
  std::optional<v1::Finding> layout;
  for (const v1::Finding& f : report->findings()) {
    if (f.kind() == v1::LAYOUT) layout = f;
  }
  ASSERT_TRUE(layout.has_value()) << report->DebugString();
  EXPECT_EQ(layout->layout().tensor(), 1) << layout->DebugString();
  EXPECT_GT(layout->predicted_gain(), 0.2);
}

// spec.rebalance.mode auto over a 2-stage pipeline of 4 blocks whose head makes stage 1 the
// bottleneck: the raised STAGE_IMBALANCE re-splits the gang (not a restart), the next
// generation's equal window verifies it, and a change that does not pay is rolled back.
class RebalanceTest : public JobManagerDoctorTest {
 protected:
  std::string RunningPipeline(const std::string& mode = "auto") {
    v1::JobSpec spec = CpuSpec(2);
    spec.mutable_model()->clear_preset();
    spec.mutable_model()->set_layers(4);
    spec.mutable_model()->set_hidden(64);
    spec.mutable_model()->set_heads(4);
    spec.mutable_model()->set_seq_len(64);
    spec.mutable_model()->set_vocab(256);
    spec.mutable_train()->set_steps(1000);
    spec.mutable_parallelism()->set_pipeline(2);
    // 8 sequences per step in micro-batches of 2: 4 micro-batches, so a re-split can pay (with
    // one, the stages run one after another).
    spec.mutable_parallelism()->set_micro_batch(2);
    spec.mutable_checkpoint()->set_every_steps(5);
    spec.mutable_rebalance()->set_mode(mode);
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    Start(job->name(), 1);
    return job->name();
  }
  void Start(const std::string& job, int64_t generation) {
    for (int r = 0; r < 2; ++r) Send(RankPhase(job, generation, r, v1::RANK_PHASE_RUNNING));
  }
  // Steps of both stages whose busy seconds are `busy0` and `busy1`; block costs every 4th step
  // under `split` (blocks 0.01 s, embedding 0.001 s, head 0.03 s).
  void PipelineSteps(const std::string& job, int64_t generation, int64_t* step, int steps,
                     double busy0, double busy1, const std::vector<int>& split) {
    for (int i = 0; i < steps; ++i, ++*step) {
      const double slowest = std::max(busy0, busy1);
      for (int stage = 0; stage < 2; ++stage) {
        const double busy = stage == 0 ? busy0 : busy1;
        v1::WorkerMessage m;
        v1::StepReport* r = m.mutable_step();
        r->set_job(job);
        r->set_generation(generation);
        r->set_rank(stage);
        r->set_step(*step);
        r->set_step_seconds(slowest + 0.001);
        (*r->mutable_phase_seconds())["forward"] = busy / 3;
        (*r->mutable_phase_seconds())["backward"] = 2 * busy / 3;
        (*r->mutable_phase_seconds())["bubble"] = slowest - busy + 0.001;
        r->set_idle_ratio((slowest - busy + 0.001) / (slowest + 0.001));
        if (*step % 4 == 0) {
          v1::BlockCosts* c = r->mutable_block_costs();
          const int first = stage == 0 ? 0 : split[0];
          c->set_first_block(first);
          for (int b = 0; b < split[stage]; ++b) {
            c->add_forward_seconds(0.004);
            c->add_backward_seconds(0.006);
          }
          if (stage == 0) {
            c->set_has_embedding(true);
            c->set_embedding_forward_seconds(0.001);
          } else {
            c->set_has_head(true);
            c->set_head_forward_seconds(0.01);
            c->set_head_backward_seconds(0.02);
          }
        }
        Send(m);
      }
      clock_.Advance(absl::Milliseconds(100));
      manager_->Tick();
    }
  }
  // The gang of `generation` was asked to checkpoint and stop (a re-split): its ranks report
  // their exits, and the job is placed again at once.
  void Exited(const std::string& job, int64_t generation) {
    for (int r = 0; r < 2; ++r) {
      Send(RankExit(job, generation, r, v1::EXIT_CLASS_STOPPED, "stopped: exit code 75"));
    }
  }
  std::vector<std::string> Reasons(const std::string& job) {
    std::vector<std::string> out;
    const v1::Job got = manager_->GetJob(job).value();
    for (const v1::JobEvent& e : got.events()) out.push_back(e.reason());
    return out;
  }
  static bool Has(const std::vector<std::string>& reasons, const std::string& part) {
    for (const std::string& r : reasons) {
      if (r.find(part) != std::string::npos) return true;
    }
    return false;
  }
};

TEST_F(RebalanceTest, AutoReSplitsVerifiesAndKeepsAChangeThatPays) {
  const std::string job = RunningPipeline();
  int64_t step = 1;
  PipelineSteps(job, 1, &step, 2 + 4 + 4 + 4, 0.021, 0.05, {2, 2});
  // Re-queued with its work kept: the ranks save and exit, then it is placed again at once:
  // generation 2, the new split.
  EXPECT_EQ(manager_->GetJob(job).value().state(), v1::RESTARTING);
  Exited(job, 1);
  v1::Job moved = manager_->GetJob(job).value();
  EXPECT_EQ(moved.state(), v1::SCHEDULED);
  EXPECT_EQ(moved.generation(), 2);
  EXPECT_EQ(moved.restart_count(), 0);  // not counted as a restart
  EXPECT_EQ(std::vector<int>(moved.layout().blocks_per_stage().begin(),
                             moved.layout().blocks_per_stage().end()),
            (std::vector<int>{3, 1}));
  EXPECT_TRUE(Has(Reasons(job),
                  "doctor: rebalance 1 of at most 2: blocks_per_stage [2, 2] -> "
                  "[3, 1]"));

  bool sent_split = false;
  for (const v1::Assignment& a : sink_->TakeAssignments()) {
    sent_split = sent_split ||
                 (a.layout().blocks_per_stage_size() == 2 && a.layout().blocks_per_stage(0) == 3);
  }
  EXPECT_TRUE(sent_split);
  Start(job, 2);
  step = 5;  // resumed from the checkpoint of step 5
  PipelineSteps(job, 2, &step, 2 + 4 * 4, 0.031, 0.04, {3, 1});
  const std::vector<std::string> reasons = Reasons(job);
  EXPECT_TRUE(Has(reasons,
                  "doctor: rebalance verified: step 0.0410 s with blocks_per_stage "
                  "[3, 1] against 0.0510 s with [2, 2] (-19.6%"));
  // The waiting stage's idle ratio went down.
  EXPECT_TRUE(Has(reasons, "stage idle ratios [0.59, 0.02] before, [0.24, 0.02] after"));
  EXPECT_FALSE(Has(reasons, "rolled back"));
  EXPECT_EQ(manager_->GetJob(job).value().state(), v1::RUNNING);
}

TEST_F(RebalanceTest, AChangeThatDoesNotPayIsRolledBackAndNotTriedAgain) {
  const std::string job = RunningPipeline();
  int64_t step = 1;
  PipelineSteps(job, 1, &step, 2 + 4 + 4 + 4, 0.021, 0.05, {2, 2});
  Exited(job, 1);
  ASSERT_EQ(manager_->GetJob(job).value().generation(), 2);
  sink_->TakeAssignments();
  Start(job, 2);
  step = 5;
  PipelineSteps(job, 2, &step, 2 + 4 * 4, 0.05, 0.05, {3, 1});  // no better
  EXPECT_TRUE(Has(Reasons(job), "it does not pay: rolling back"));
  Exited(job, 2);
  v1::Job back = manager_->GetJob(job).value();
  EXPECT_EQ(back.generation(), 3);
  EXPECT_EQ(std::vector<int>(back.layout().blocks_per_stage().begin(),
                             back.layout().blocks_per_stage().end()),
            (std::vector<int>{2, 2}));
  sink_->TakeAssignments();
  Start(job, 3);
  step = 5;
  PipelineSteps(job, 3, &step, 2 + 4 * 6, 0.021, 0.05, {2, 2});  // imbalanced again: no 2nd try
  EXPECT_EQ(manager_->GetJob(job).value().state(), v1::RUNNING);
  EXPECT_FALSE(Has(Reasons(job), "doctor: rebalance 2 of"));
}

TEST_F(RebalanceTest, OffProposesNoSplitAndSuggestDoesNotApplyIt) {
  for (const std::string mode : {"off", "suggest"}) {
    const std::string job = RunningPipeline(mode);
    int64_t step = 1;
    PipelineSteps(job, 1, &step, 2 + 4 + 4 + 4, 0.021, 0.05, {2, 2});
    const absl::StatusOr<v1::JobReport> report = manager_->GetJobReport(job);
    ASSERT_TRUE(report.ok());
    std::optional<v1::Finding> imbalance;
    for (const v1::Finding& f : report->findings()) {
      if (f.kind() == v1::STAGE_IMBALANCE) imbalance = f;
    }
    ASSERT_TRUE(imbalance.has_value()) << mode;
    EXPECT_EQ(imbalance->blocks_per_stage_size(), mode == "off" ? 0 : 2) << mode;
    if (mode == "off") {
      EXPECT_THAT(imbalance->fix(), HasSubstr("spec.rebalance.mode"));
    }
    EXPECT_EQ(manager_->GetJob(job).value().generation(), 1) << mode;  // never re-split
    ASSERT_TRUE(manager_->CancelJob(job).ok());
  }
}

TEST_F(JobManagerDoctorTest, EvenRanksRaiseNothing) {
  const std::string job = RunningDataParallelJob();
  int64_t step = 1;
  Steps(job, &step, 40, 1.0);
  EXPECT_TRUE(DoctorEvents(job).empty());
  absl::StatusOr<v1::JobReport> report = manager_->GetJobReport(job);
  ASSERT_TRUE(report.ok());
  EXPECT_GE(report->windows(), 8);
  EXPECT_EQ(report->findings_size(), 0);
  EXPECT_EQ(report->pending_size(), 0);
}

}  // namespace
}  // namespace loom::jobs
