// The job state machine: every one of the 8 × 8 (from, to) pairs against the table of the
// design, and the fields that go with each state change.
#include <map>
#include <set>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/jobs/job_state_machine.h"

namespace loom::jobs {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

constexpr v1::JobState kAllStates[] = {v1::JOB_STATE_UNSPECIFIED,
                                       v1::QUEUED,
                                       v1::SCHEDULED,
                                       v1::RUNNING,
                                       v1::SUCCEEDED,
                                       v1::FAILED,
                                       v1::CANCELLED,
                                       v1::RESTARTING};

// The design's table, written out pair by pair (independently of the implementation).
const std::set<std::pair<v1::JobState, v1::JobState>>& AllowedPairs() {
  static const auto* const allowed = new std::set<std::pair<v1::JobState, v1::JobState>>{
      {v1::JOB_STATE_UNSPECIFIED, v1::QUEUED},
      {v1::QUEUED, v1::SCHEDULED},
      {v1::QUEUED, v1::FAILED},
      {v1::QUEUED, v1::CANCELLED},
      {v1::SCHEDULED, v1::RUNNING},
      {v1::SCHEDULED, v1::RESTARTING},
      {v1::SCHEDULED, v1::FAILED},
      {v1::SCHEDULED, v1::CANCELLED},
      {v1::RUNNING, v1::SUCCEEDED},
      {v1::RUNNING, v1::RESTARTING},
      {v1::RUNNING, v1::FAILED},
      {v1::RUNNING, v1::CANCELLED},
      {v1::RESTARTING, v1::SCHEDULED},
      {v1::RESTARTING, v1::FAILED},
      {v1::RESTARTING, v1::CANCELLED},
  };
  return *allowed;
}

absl::Time T(int64_t seconds) { return absl::FromUnixSeconds(seconds); }

v1::Job JobIn(v1::JobState state) {
  v1::Job job;
  job.set_name("jobs/x");
  job.set_state(state);
  job.set_state_reason("before");
  job.set_generation(3);
  job.set_restart_count(1);
  job.mutable_spec()->mutable_restart()->set_max_restarts(5);
  return job;
}

class TransitionTableTest
    : public ::testing::TestWithParam<std::tuple<v1::JobState, v1::JobState>> {};

TEST_P(TransitionTableTest, FollowsTheTable) {
  const auto [from, to] = GetParam();
  const bool allowed = AllowedPairs().count({from, to}) > 0;
  EXPECT_EQ(IsTransitionAllowed(from, to), allowed);

  v1::Job job = JobIn(from);
  const v1::Job before = job;
  auto event = Transition(job, to, "because", T(1000));
  if (allowed) {
    ASSERT_TRUE(event.ok()) << event.status();
    EXPECT_EQ(job.state(), to);
    EXPECT_EQ(job.state_reason(), "because");
    EXPECT_EQ(job.update_time().seconds(), 1000);
    EXPECT_EQ(event->from_state(), from);
    EXPECT_EQ(event->to_state(), to);
    EXPECT_EQ(event->reason(), "because");
    EXPECT_EQ(event->time().seconds(), 1000);
    EXPECT_EQ(event->generation(), job.generation());
    EXPECT_EQ(event->sequence(), 0) << "the store assigns sequences";
  } else {
    ASSERT_FALSE(event.ok());
    EXPECT_EQ(event.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(event.status().message(), "job jobs/x is " + v1::JobState_Name(from) +
                                            "; cannot move to " + v1::JobState_Name(to));
    EXPECT_TRUE(MessageDifferencer::Equals(job, before)) << "a refused job is untouched";
  }
}

INSTANTIATE_TEST_SUITE_P(AllPairs, TransitionTableTest,
                         ::testing::Combine(::testing::ValuesIn(kAllStates),
                                            ::testing::ValuesIn(kAllStates)),
                         [](const auto& info) {
                           return v1::JobState_Name(std::get<0>(info.param)) + "_to_" +
                                  v1::JobState_Name(std::get<1>(info.param));
                         });

TEST(JobStateMachineTest, TerminalStatesAreExactlyTheThree) {
  for (v1::JobState state : kAllStates) {
    const bool terminal = state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
    EXPECT_EQ(IsTerminal(state), terminal) << v1::JobState_Name(state);
  }
}

TEST(JobStateMachineTest, StatesOutsideTheEnumGoNowhere) {
  EXPECT_FALSE(IsTransitionAllowed(static_cast<v1::JobState>(42), v1::FAILED));
  EXPECT_FALSE(IsTransitionAllowed(v1::QUEUED, static_cast<v1::JobState>(42)));
}

TEST(JobStateMachineTest, AWholeLifeSetsTimesGenerationsAndRestarts) {
  v1::Job job;
  job.set_name("jobs/life");
  job.mutable_spec()->mutable_restart()->set_max_restarts(1);

  ASSERT_TRUE(Transition(job, v1::QUEUED, "created", T(100)).ok());
  EXPECT_EQ(job.create_time().seconds(), 100);
  EXPECT_EQ(job.generation(), 0);

  ASSERT_TRUE(Transition(job, v1::SCHEDULED, "placed", T(110)).ok());
  EXPECT_EQ(job.generation(), 1);
  ASSERT_TRUE(Transition(job, v1::RUNNING, "all ranks started", T(120)).ok());
  EXPECT_EQ(job.start_time().seconds(), 120);
  EXPECT_FALSE(job.has_end_time());

  auto restart = Transition(job, v1::RESTARTING, "rank 1 killed by signal 9", T(130));
  ASSERT_TRUE(restart.ok());
  EXPECT_EQ(job.restart_count(), 1);
  EXPECT_EQ(restart->generation(), 1);

  auto again = Transition(job, v1::SCHEDULED, "placed again", T(140));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(job.generation(), 2) << "each launch of the gang gets a new generation";
  EXPECT_EQ(again->generation(), 2);
  ASSERT_TRUE(Transition(job, v1::RUNNING, "all ranks started", T(150)).ok());
  EXPECT_EQ(job.start_time().seconds(), 120) << "the first start is kept";

  // The one allowed restart is used: another retryable failure is final.
  EXPECT_EQ(StateAfterRetryableFailure(job), v1::FAILED);
  auto refused = Transition(job, v1::RESTARTING, "rank 0 crashed", T(160));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("move it to FAILED"));
  EXPECT_EQ(job.state(), v1::RUNNING);

  ASSERT_TRUE(Transition(job, v1::FAILED, "rank 0 crashed; restarts exhausted", T(170)).ok());
  EXPECT_EQ(job.end_time().seconds(), 170);
  EXPECT_EQ(job.update_time().seconds(), 170);
}

TEST(JobStateMachineTest, CreateTimeIsKeptWhenAlreadySet) {
  v1::Job job;
  job.set_name("jobs/x");
  job.mutable_create_time()->set_seconds(5);
  ASSERT_TRUE(Transition(job, v1::QUEUED, "created", T(100)).ok());
  EXPECT_EQ(job.create_time().seconds(), 5);
}

TEST(JobStateMachineTest, SubSecondTimesKeepTheirNanos) {
  v1::Job job = JobIn(v1::QUEUED);
  ASSERT_TRUE(Transition(job, v1::CANCELLED, "by user", T(7) + absl::Milliseconds(250)).ok());
  EXPECT_EQ(job.end_time().seconds(), 7);
  EXPECT_EQ(job.end_time().nanos(), 250'000'000);
}

TEST(JobStateMachineTest, AnEmptyReasonIsRefused) {
  v1::Job job = JobIn(v1::QUEUED);
  const v1::Job before = job;
  auto event = Transition(job, v1::CANCELLED, "", T(1));
  EXPECT_EQ(event.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(event.status().message(), HasSubstr("reason"));
  EXPECT_TRUE(MessageDifferencer::Equals(job, before));
}

TEST(JobStateMachineTest, RetryableFailureRestartsWhileRestartsRemain) {
  v1::Job job = JobIn(v1::RUNNING);
  job.mutable_spec()->mutable_restart()->set_max_restarts(2);
  job.set_restart_count(0);
  EXPECT_EQ(StateAfterRetryableFailure(job), v1::RESTARTING);
  job.set_restart_count(1);
  EXPECT_EQ(StateAfterRetryableFailure(job), v1::RESTARTING);
  job.set_restart_count(2);
  EXPECT_EQ(StateAfterRetryableFailure(job), v1::FAILED);
  job.mutable_spec()->mutable_restart()->set_max_restarts(0);
  job.set_restart_count(0);
  EXPECT_EQ(StateAfterRetryableFailure(job), v1::FAILED);
}

// A drain or a start timeout re-queues the gang without spending a restart, even when none is
// left.
TEST(JobStateMachineTest, AFreeRestartNeitherSpendsNorNeedsARestart) {
  v1::Job job = JobIn(v1::RUNNING);  // restart_count 1
  job.mutable_spec()->mutable_restart()->set_max_restarts(1);
  auto charged = Transition(job, v1::RESTARTING, "rank crashed", T(1));
  EXPECT_EQ(charged.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Transition(job, v1::RESTARTING, "node draining", T(2), RestartCharge::kFree).ok());
  EXPECT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restart_count(), 1) << "not spent";
}

TEST(JobStateMachineTest, BackoffDoublesAndIsCapped) {
  v1::Job job = JobIn(v1::RESTARTING);
  job.mutable_spec()->mutable_restart()->set_backoff_seconds(1.5);
  const std::map<int, absl::Duration> expected = {
      {0, absl::ZeroDuration()}, {1, absl::Seconds(1.5)}, {2, absl::Seconds(3)},
      {3, absl::Seconds(6)},     {13, absl::Hours(1)},    {100, absl::Hours(1)}};
  for (const auto& [restarts, backoff] : expected) {
    job.set_restart_count(restarts);
    EXPECT_EQ(RestartBackoff(job), backoff) << restarts << " restarts";
  }
  job.mutable_spec()->mutable_restart()->set_backoff_seconds(0);
  job.set_restart_count(3);
  EXPECT_EQ(RestartBackoff(job), absl::ZeroDuration());
}

}  // namespace
}  // namespace loom::jobs
