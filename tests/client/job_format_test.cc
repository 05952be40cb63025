// Table renderings (client/job_format.h) and job names (client/job_name.h).
#include "client/job_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "client/job_name.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

void SetTime(google::protobuf::Timestamp* ts, absl::Time t) {
  ts->set_seconds(absl::ToUnixSeconds(t));
}

loom::v1::Job RunningJob() {
  loom::v1::Job job;
  job.set_name("jobs/abc");
  job.set_state(loom::v1::RUNNING);
  job.mutable_spec()->set_name("demo");
  job.mutable_spec()->mutable_model()->set_preset("tiny");
  job.mutable_spec()->mutable_resources()->set_cpu_devices(4);
  job.mutable_spec()->mutable_train()->set_steps(200);
  job.set_generation(1);
  auto* p = job.mutable_progress();
  p->set_step(12);
  p->set_total_steps(200);
  p->set_loss(3.91);
  p->set_tokens_per_second(5120);
  p->set_eta_seconds(83);
  SetTime(job.mutable_create_time(), kNow - absl::Minutes(3));
  return job;
}

TEST(JobFormatTest, ShortDurations) {
  EXPECT_EQ(FormatShortDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(FormatShortDuration(absl::Seconds(185)), "3m05s");
  EXPECT_EQ(FormatShortDuration(absl::Hours(2) + absl::Minutes(7)), "2h07m");
  EXPECT_EQ(FormatShortDuration(absl::Hours(76)), "3d04h");
  EXPECT_EQ(FormatShortDuration(-absl::Seconds(5)), "0s");
}

TEST(JobFormatTest, ProgressLineShowsStateStepLossRateAndEta) {
  EXPECT_EQ(FormatProgressLine(RunningJob()),
            "jobs/abc RUNNING  step 12/200 (6%)  loss 3.9100  5.1k tok/s  ETA 1m23s");
}

TEST(JobFormatTest, ProgressLineLeavesOutWhatIsNotKnownYet) {
  loom::v1::Job job;
  job.set_name("jobs/q");
  job.set_state(loom::v1::QUEUED);
  EXPECT_EQ(FormatProgressLine(job), "jobs/q QUEUED");
  job = RunningJob();
  job.set_state(loom::v1::RESTARTING);
  job.set_restart_count(2);
  EXPECT_THAT(FormatProgressLine(job), ::testing::StartsWith("jobs/abc RESTARTING (restart 2)"));
}

TEST(JobFormatTest, TerminalLineHasNoEta) {
  loom::v1::Job job = RunningJob();
  job.set_state(loom::v1::SUCCEEDED);
  job.mutable_progress()->set_step(200);
  EXPECT_THAT(FormatProgressLine(job), Not(HasSubstr("ETA")));
  SetTime(job.mutable_start_time(), kNow - absl::Seconds(65));
  SetTime(job.mutable_end_time(), kNow);
  EXPECT_EQ(FormatOutcomeLine(job), "jobs/abc SUCCEEDED in 1m05s (200 steps, final loss 3.9100)");
  job.set_state(loom::v1::FAILED);
  job.set_restart_count(2);
  job.set_state_reason("rank 1 killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(FormatOutcomeLine(job),
            "jobs/abc FAILED after 2 restarts: rank 1 killed by signal 11 (SIGSEGV)");
}

TEST(JobFormatTest, JobTableAlignsColumns) {
  loom::v1::Job queued;
  queued.set_name("jobs/a-much-longer-name");
  queued.set_state(loom::v1::QUEUED);
  queued.mutable_spec()->mutable_resources()->set_gpus(8);
  const std::string table = FormatJobTable({RunningJob(), queued}, kNow);
  EXPECT_EQ(table,
            "NAME                     STATE    STEP    LOSS    DEVICES  AGE\n"
            "jobs/abc                 RUNNING  12/200  3.9100  4 cpu    3m00s\n"
            "jobs/a-much-longer-name  QUEUED   -       -       8 gpu    -\n");
}

TEST(JobFormatTest, JobDetailsListPlacementsAndEvents) {
  loom::v1::Job job = RunningJob();
  job.set_state_reason("every rank has started");
  auto* layout = job.mutable_layout();
  layout->set_data(2);
  layout->set_tensor(2);
  layout->set_pipeline(1);
  layout->set_micro_batch(4);
  layout->set_num_micro_batches(1);
  auto* pl = job.add_placements();
  pl->set_node("nodes/w0");
  pl->add_ranks(0);
  pl->add_ranks(1);
  pl->add_device_indices(0);
  pl->add_device_indices(1);
  auto* ev = job.add_events();
  ev->set_from_state(loom::v1::SCHEDULED);
  ev->set_to_state(loom::v1::RUNNING);
  ev->set_reason("every rank has started");
  ev->set_generation(1);
  SetTime(ev->mutable_time(), kNow);
  auto* created = job.add_events();
  created->set_to_state(loom::v1::QUEUED);
  created->set_reason("created");
  const std::string text = FormatJobDetails(job, kNow);
  EXPECT_THAT(text, HasSubstr("Name:        jobs/abc\n"));
  EXPECT_THAT(text, HasSubstr("State:       RUNNING (every rank has started)\n"));
  EXPECT_THAT(text, HasSubstr("demo, model tiny, 4 cpu, 200 steps"));
  EXPECT_THAT(text, HasSubstr("data=2 tensor=2 pipeline=1 micro_batch=4 num_micro_batches=1"));
  EXPECT_THAT(text, HasSubstr("step 12/200 (6%)  loss 3.9100"));
  EXPECT_THAT(text, HasSubstr("Created:     2023-11-14T22:10:20Z (3m00s ago)"));
  EXPECT_THAT(text, HasSubstr("  nodes/w0  0,1    0,1"));
  EXPECT_THAT(text, HasSubstr("2023-11-14T22:13:20Z  1    SCHEDULED -> RUNNING  every rank"));
  EXPECT_THAT(text, HasSubstr("  -                     0    (new) -> QUEUED       created"));
}

TEST(JobFormatTest, JobDetailsShowMeasuredStepTimeBesideThePrediction) {
  loom::v1::Job job = RunningJob();
  job.mutable_plan()->set_step_seconds(0.25);
  job.mutable_plan()->set_tokens_per_second(4096);
  job.mutable_plan()->set_mfu(0.1);
  std::string text = FormatJobDetails(job, kNow);
  EXPECT_THAT(text, HasSubstr("Predicted:   0.250 s/step"));
  EXPECT_THAT(text, Not(HasSubstr("Measured:")));  // nothing measured yet

  loom::v1::PlanCheck* check = job.mutable_plan_check();
  check->set_predicted_step_seconds(0.25);
  check->set_measured_step_seconds(0.3);
  check->set_ratio(1.2);
  check->set_measured_steps(8);
  text = FormatJobDetails(job, kNow);
  EXPECT_THAT(text, HasSubstr("Measured:    0.300 s/step (1.20x predicted, median of 8 steps)\n"));
}

TEST(JobFormatTest, NodeTableCountsDevices) {
  loom::v1::Node node;
  node.set_name("nodes/w0");
  node.set_state(loom::v1::NODE_STATE_LOST);
  node.set_address("127.0.0.1:5000");
  for (int i = 0; i < 2; ++i) {
    auto* d = node.add_devices();
    d->set_kind(loom::v1::DEVICE_KIND_CPU);
    d->set_index(i);
  }
  node.add_allocated_devices(1);
  SetTime(node.mutable_last_heartbeat(), kNow - absl::Seconds(4));
  EXPECT_EQ(FormatNodeTable({node}, kNow),
            "NAME      STATE  DEVICES  ALLOCATED  ADDRESS         HEARTBEAT\n"
            "nodes/w0  LOST   2 cpu    1/2        127.0.0.1:5000  4s ago\n");
  node.set_state(loom::v1::NODE_STATE_READY);
  node.set_draining(true);
  node.set_unhealthy_reason("disk full");
  node.add_quarantined("jobs/x@2");
  EXPECT_THAT(FormatNodeTable({node}, kNow),
              ::testing::HasSubstr("READY,draining,unhealthy,quarantined:1"));
}

TEST(JobFormatTest, LogLines) {
  loom::v1::LogLine line;
  line.set_rank(3);
  line.set_generation(2);
  line.set_stream("stdout");
  line.set_text("step 1");
  EXPECT_EQ(FormatLogLine(line), "[gen 2 rank 3] step 1");
  line.set_stream("stderr");
  EXPECT_EQ(FormatLogLine(line), "[gen 2 rank 3 stderr] step 1");
}

TEST(JobNameTest, AcceptsShortAndFullNames) {
  EXPECT_EQ(*NormalizeJobName("abc"), "jobs/abc");
  EXPECT_EQ(*NormalizeJobName("jobs/abc"), "jobs/abc");
  for (const char* bad : {"", "jobs/", "nodes/x", "a b", "jobs/a/b"}) {
    auto name = NormalizeJobName(bad);
    ASSERT_FALSE(name.ok()) << bad;
    EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(name.status().message()), HasSubstr("'abc' or 'jobs/abc'"));
  }
  EXPECT_EQ(ShortJobId("jobs/abc"), "abc");
}

}  // namespace
}  // namespace loom::client
