// Calibration end to end through the JobManager, without a network: a CPU job planned with the
// catalog's efficiency runs 7× slower than predicted and succeeds; the next plan for the same
// model and devices (PlanJob, and CreateJob with `auto`) predicts the measured time, and says
// that it is calibrated. In-memory job and calibration stores, a fake clock, fake sessions.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/calibration/calibration_store.h"
#include "server/calibration/calibrator.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
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
using ::testing::Contains;
using ::testing::HasSubstr;

// Rank 0's report of one step of `seconds`, split into the profiler's phases.
v1::WorkerMessage StepOf(const std::string& job, int64_t step, double seconds) {
  v1::WorkerMessage m = ::loom::testing::Step(job, 1, 0, step, 100, 3.0);
  m.mutable_step()->set_step_seconds(seconds);
  auto& phases = *m.mutable_step()->mutable_phase_seconds();
  phases["data"] = 0.05 * seconds;
  phases["forward"] = 0.25 * seconds;
  phases["backward"] = 0.5 * seconds;
  phases["optimizer"] = 0.2 * seconds;
  return m;
}

class CalibrationManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = store::NewMemoryJobStore();
    calibration_store_ = calibration::NewMemoryCalibrationStore();
    auto calibrator = calibration::Calibrator::Create(calibration_store_.get(), &clock_);
    ASSERT_TRUE(calibrator.ok()) << calibrator.status();
    calibrator_ = std::move(*calibrator);
    auto logs = LogStore::Open(dir_.File("logs"));
    ASSERT_TRUE(logs.ok()) << logs.status();
    logs_ = std::move(*logs);
    JobManagerOptions options;
    options.rendezvous_address = "loomd.test:7070";
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), logs_.get(),
                                      nullptr, nullptr, options, calibrator_.get());
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
    ASSERT_TRUE(manager_->RegisterNode(CpuNode("n1", 1)).ok());
    sink_ = std::make_shared<FakeSink>();
    v1::SessionHello hello;
    hello.set_node_id("n1");
    absl::StatusOr<uint64_t> session = manager_->OpenSession(hello, sink_);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *session;
  }

  void Send(const v1::WorkerMessage& message) {
    absl::Status status = manager_->HandleWorkerMessage("n1", session_, message);
    ASSERT_TRUE(status.ok()) << status;
  }

  // Creates an `auto` job for one CPU device and returns it as created.
  v1::Job Create() {
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(CpuSpec(1)));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.value_or(v1::Job());
  }

  // Runs `job` to the end: 2 warmup steps, then `steps` steps of `seconds` each, then exit 0.
  void RunToSuccess(const v1::Job& job, double seconds, int steps) {
    Send(RankPhase(job.name(), 1, 0, v1::RANK_PHASE_RUNNING));
    Send(StepOf(job.name(), 1, 10 * seconds));
    Send(StepOf(job.name(), 2, 10 * seconds));
    for (int i = 0; i < steps; ++i) Send(StepOf(job.name(), 3 + i, seconds));
    Send(RankExit(job.name(), 1, 0, v1::EXIT_CLASS_SUCCESS));
    absl::StatusOr<v1::Job> done = manager_->GetJob(job.name());
    ASSERT_TRUE(done.ok());
    ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->state_reason();
  }

  v1::PlanJobResponse Plan() {
    v1::PlanJobRequest request;
    *request.mutable_spec() = CpuSpec(1);
    absl::StatusOr<v1::PlanJobResponse> response = manager_->PlanJob(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.value_or(v1::PlanJobResponse());
  }

  store::testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<store::JobStore> store_;
  std::unique_ptr<calibration::CalibrationStore> calibration_store_;
  std::unique_ptr<calibration::Calibrator> calibrator_;
  std::unique_ptr<LogStore> logs_;
  std::unique_ptr<JobManager> manager_;
  std::shared_ptr<FakeSink> sink_;
  uint64_t session_ = 0;
};

TEST_F(CalibrationManagerTest, AFinishedJobCorrectsTheNextPrediction) {
  const v1::Job first = Create();
  ASSERT_TRUE(first.has_plan()) << first.events(0).reason();
  const double predicted = first.plan().step_seconds();
  ASSERT_GT(predicted, 0);
  EXPECT_EQ(first.plan().calibration().device_model(), "cpu");
  EXPECT_EQ(first.plan().calibration().jobs(), 0);
  EXPECT_THAT(first.plan().reasons(), Contains(HasSubstr("catalog's defaults for cpu")));
  const v1::PlanJobResponse before = Plan();
  ASSERT_GT(before.plans_size(), 0);
  EXPECT_DOUBLE_EQ(before.plans(0).step_seconds(), predicted);

  const double measured = 7.0 * predicted;
  RunToSuccess(first, measured, 5);
  const v1::Job done = *manager_->GetJob(first.name());
  EXPECT_DOUBLE_EQ(done.plan_check().measured_step_seconds(), measured);

  // PlanJob on the live cluster now predicts the measured time, and says why.
  const v1::PlanJobResponse after = Plan();
  ASSERT_GT(after.plans_size(), 0);
  EXPECT_NEAR(after.plans(0).step_seconds(), measured, 0.2 * measured);
  EXPECT_EQ(after.plans(0).calibration().jobs(), 1);
  EXPECT_EQ(after.plans(0).calibration().optimizer_jobs(), 1);  // the step reports had phases
  EXPECT_GT(after.plans(0).calibration().compute_scale(), 1.0);
  EXPECT_NEAR(after.plans(0).phases().optimizer(), 0.2 * measured, 1e-6 * measured);
  EXPECT_THAT(after.plans(0).reasons(),
              Contains(HasSubstr("efficiency calibrated from 1 finished job on cpu")));

  // So does the plan of the next `auto` job, which records the calibration it was made with.
  const v1::Job second = Create();
  ASSERT_TRUE(second.has_plan());
  EXPECT_NEAR(second.plan().step_seconds(), measured, 0.2 * measured);
  EXPECT_EQ(second.plan().calibration().jobs(), 1);

  // That job runs as predicted now: the calibration holds (ratio 1), with two jobs folded in.
  RunToSuccess(second, second.plan().step_seconds(), 5);
  const v1::PlanJobResponse settled = Plan();
  EXPECT_EQ(settled.plans(0).calibration().jobs(), 2);
  EXPECT_NEAR(settled.plans(0).step_seconds(), second.plan().step_seconds(),
              0.02 * second.plan().step_seconds());
  EXPECT_EQ(calibration_store_->ListRecords("cpu")->size(), 2u);
}

TEST_F(CalibrationManagerTest, JobsThatDoNotSucceedOrWereNotMeasuredTeachNothing) {
  // Cancelled after measured steps: not a finished run.
  const v1::Job cancelled = Create();
  Send(RankPhase(cancelled.name(), 1, 0, v1::RANK_PHASE_RUNNING));
  for (int i = 1; i <= 8; ++i) Send(StepOf(cancelled.name(), i, 1.0));
  ASSERT_TRUE(manager_->CancelJob(cancelled.name()).ok());
  // Succeeded after only the warmup: nothing measured.
  const v1::Job quick = Create();
  Send(RankPhase(quick.name(), 1, 0, v1::RANK_PHASE_RUNNING));
  Send(StepOf(quick.name(), 1, 1.0));
  Send(StepOf(quick.name(), 2, 1.0));
  Send(RankExit(quick.name(), 1, 0, v1::EXIT_CLASS_SUCCESS));
  ASSERT_EQ(manager_->GetJob(quick.name())->state(), v1::SUCCEEDED);

  EXPECT_TRUE(calibrator_->Applicable().empty());
  EXPECT_EQ(Plan().plans(0).calibration().jobs(), 0);
  EXPECT_TRUE(calibration_store_->ListRecords("cpu")->empty());
}

}  // namespace
}  // namespace loom::jobs
