// The doctor inside the JobManager (no network): step reports of a running job fill its window,
// the tick judges it every few steps, a persistent finding is raised as a job event carrying the
// finding, served by GetJobReport and exported as loom_job_finding / loom_rank_straggler_score,
// and the series go when the job ends.
#include <memory>
#include <optional>
#include <string>

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
