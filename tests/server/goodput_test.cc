// The goodput ledger (server/doctor/goodput.h): a job's life as a table of events in, where its
// time went out; the buckets always sum to the wall time.
#include "server/doctor/goodput.h"

#include <limits>

#include "gtest/gtest.h"

namespace loom::doctor {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);
absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

double Sum(const v1::Goodput& g) {
  return g.productive_seconds() + g.queued_seconds() + g.starting_seconds() +
         g.checkpointing_seconds() + g.restart_seconds() + g.rebalance_seconds() +
         g.other_seconds();
}

// Steps `first`..`last` of `generation`, each `seconds` long, back to back from `start`.
absl::Time RunSteps(GoodputLedger& l, int64_t generation, int64_t first, int64_t last,
                    double seconds, absl::Time start) {
  absl::Time t = start;
  for (int64_t s = first; s <= last; ++s) {
    t += absl::Seconds(seconds);
    l.Step(generation, s, seconds, t);
  }
  return t;
}

TEST(GoodputTest, AnUninterruptedJobSplitsIntoQueuedStartingProductiveAndCheckpoints) {
  GoodputLedger l(kT0, {}, v1::QUEUED, kT0);
  l.EnterState(v1::SCHEDULED, WaitCause::kQueued, At(3));  // 3 s queued
  l.EnterState(v1::RUNNING, WaitCause::kQueued, At(4));    // starting continues
  absl::Time t = RunSteps(l, 1, 1, 10, 0.5, At(6));        // first step ends at 6.5
  l.Checkpoint(1.0);
  t = RunSteps(l, 1, 11, 20, 0.5, t + absl::Seconds(1));
  l.EnterState(v1::SUCCEEDED, WaitCause::kQueued, t + absl::Seconds(0.5));
  const v1::Goodput g = l.Snapshot(t + absl::Seconds(100));  // frozen at the end
  EXPECT_DOUBLE_EQ(g.queued_seconds(), 3);
  EXPECT_DOUBLE_EQ(g.starting_seconds(), 3);  // 3 .. 6, the first step began at 6
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 10);
  EXPECT_DOUBLE_EQ(g.checkpointing_seconds(), 1);
  EXPECT_DOUBLE_EQ(g.wall_seconds(), 17.5);
  EXPECT_DOUBLE_EQ(g.other_seconds(), 0.5);
  EXPECT_NEAR(Sum(g), g.wall_seconds(), 1e-9);
  EXPECT_NEAR(g.ratio(), 10 / 17.5, 1e-12);
  EXPECT_EQ(g.steps_lost(), 0);
  EXPECT_EQ(g.kept_steps(), 20);
}

TEST(GoodputTest, ARestartChargesItsWaitAndTheStepsTrainedAgain) {
  GoodputLedger l(kT0, {}, v1::QUEUED, kT0);
  l.EnterState(v1::SCHEDULED, WaitCause::kQueued, At(0));
  l.EnterState(v1::RUNNING, WaitCause::kQueued, At(1));
  absl::Time t = RunSteps(l, 1, 1, 30, 1.0, At(1));      // steps 1..30, checkpoint at 20 (not seen)
  l.EnterState(v1::RESTARTING, WaitCause::kRestart, t);  // a rank died
  l.EnterState(v1::SCHEDULED, WaitCause::kQueued, t + absl::Seconds(5));  // 5 s backoff
  l.EnterState(v1::RUNNING, WaitCause::kQueued, t + absl::Seconds(6));
  // Generation 2 resumes from step 20: steps 21..30 are trained again.
  t = RunSteps(l, 2, 21, 40, 1.0, t + absl::Seconds(7));
  const v1::Goodput g = l.Snapshot(t);
  EXPECT_EQ(g.steps_lost(), 10);
  EXPECT_DOUBLE_EQ(g.restart_seconds(), 5 + 10);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 40);
  EXPECT_EQ(g.kept_steps(), 40);
  EXPECT_DOUBLE_EQ(g.starting_seconds(), 1 + 2);  // placed to first step, twice
  EXPECT_NEAR(Sum(g), g.wall_seconds(), 1e-9);
}

TEST(GoodputTest, TheDoctorsResplitIsChargedToRebalancing) {
  GoodputLedger l(kT0, {}, v1::QUEUED, kT0);
  l.EnterState(v1::SCHEDULED, WaitCause::kQueued, At(0));
  l.EnterState(v1::RUNNING, WaitCause::kQueued, At(0));
  absl::Time t = RunSteps(l, 1, 1, 12, 1.0, At(0));
  l.EnterState(v1::RESTARTING, WaitCause::kRebalance, t);
  l.EnterState(v1::QUEUED, WaitCause::kQueued, t + absl::Seconds(2));  // still its wait
  l.EnterState(v1::SCHEDULED, WaitCause::kQueued, t + absl::Seconds(3));
  l.EnterState(v1::RUNNING, WaitCause::kQueued, t + absl::Seconds(3));
  t = RunSteps(l, 2, 13, 20, 0.5, t + absl::Seconds(4));  // saved at 12: nothing lost
  const v1::Goodput g = l.Snapshot(t);
  EXPECT_DOUBLE_EQ(g.rebalance_seconds(), 3);
  EXPECT_DOUBLE_EQ(g.restart_seconds(), 0);
  EXPECT_DOUBLE_EQ(g.queued_seconds(), 0);
  EXPECT_EQ(g.steps_lost(), 0);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 12 + 4);
  EXPECT_NEAR(Sum(g), g.wall_seconds(), 1e-9);
}

TEST(GoodputTest, ReportsSentTwiceAndStaleGenerationsCountOnce) {
  GoodputLedger l(kT0, {}, v1::SCHEDULED, kT0);
  l.EnterState(v1::RUNNING, WaitCause::kQueued, At(1));
  l.Step(1, 1, 1.0, At(2));
  l.Step(1, 1, 1.0, At(2));  // replayed after a reconnect
  l.Step(1, 2, 1.0, At(3));
  l.EnterState(v1::RESTARTING, WaitCause::kRestart, At(3));
  l.EnterState(v1::SCHEDULED, WaitCause::kQueued, At(4));
  l.Step(2, 3, 1.0, At(6));
  l.Step(1, 3, 1.0, At(6));  // the old gang, late
  const v1::Goodput g = l.Snapshot(At(6));
  EXPECT_EQ(g.kept_steps(), 3);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 3);
  EXPECT_NEAR(Sum(g), g.wall_seconds(), 1e-9);
}

TEST(GoodputTest, HostileFiguresDoNotBreakTheSum) {
  GoodputLedger l(kT0, {}, v1::RUNNING, kT0);
  l.Step(1, 1, -5, At(1));
  l.Step(1, 2, std::numeric_limits<double>::quiet_NaN(), At(2));
  l.Checkpoint(-1);
  l.Checkpoint(std::numeric_limits<double>::infinity());
  l.Step(1, 3, 1e9, At(3));  // more than the wall time: other is clamped at 0
  const v1::Goodput g = l.Snapshot(At(3));
  EXPECT_GE(g.other_seconds(), 0);
  EXPECT_LE(g.ratio(), 1.0);
  EXPECT_EQ(g.checkpointing_seconds(), 0);
}

TEST(GoodputTest, ALoomdRestartKeepsTheClosedBucketsAndCountsItsAbsenceAsOther) {
  GoodputLedger before(kT0, {}, v1::QUEUED, kT0);
  before.EnterState(v1::SCHEDULED, WaitCause::kQueued, At(10));
  before.EnterState(v1::RUNNING, WaitCause::kQueued, At(11));
  RunSteps(before, 1, 1, 5, 1.0, At(11));
  const v1::Goodput persisted = before.Snapshot(At(16));
  // loomd is away from 16 to 30; the job kept running.
  GoodputLedger after(kT0, persisted, v1::RUNNING, At(30));
  after.Step(1, 6, 1.0, At(31));
  const v1::Goodput g = after.Snapshot(At(31));
  EXPECT_DOUBLE_EQ(g.queued_seconds(), 10);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 6);
  EXPECT_EQ(g.steps_lost(), 0);
  EXPECT_DOUBLE_EQ(g.wall_seconds(), 31);
  EXPECT_NEAR(Sum(g), 31, 1e-9);
  EXPECT_GE(g.other_seconds(), 14);
}

}  // namespace
}  // namespace loom::doctor
