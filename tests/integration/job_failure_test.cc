// Rank failures on a real cluster: a crash stops the whole gang and restarts it up to
// max_restarts; a permanent failure (exit code 2) fails the job at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

// The events of `job` as "FROM->TO: reason" lines, for assertions and messages.
std::vector<std::string> EventLines(const loom::v1::Job& job) {
  std::vector<std::string> lines;
  for (const auto& e : job.events()) {
    lines.push_back(absl::StrCat(loom::v1::JobState_Name(e.from_state()), "->",
                                 loom::v1::JobState_Name(e.to_state()), " gen ", e.generation(),
                                 ": ", e.reason()));
  }
  return lines;
}

int CountTransitionsTo(const loom::v1::Job& job, loom::v1::JobState state) {
  int n = 0;
  for (const auto& e : job.events()) n += e.to_state() == state;
  return n;
}

TEST_F(IntegrationTest, CrashingRankRestartsTheGangThenFails) {
  const TestJob job{.name = "crashes",
                    .devices = 4,
                    .steps = 50,
                    .step_ms = 50,
                    .max_restarts = 2,
                    .backoff_seconds = 0.1,
                    .crash_rank = 1,
                    .crash_mode = "signal"};
  auto name = Submit(job, {"--wait"});
  ASSERT_FALSE(name.ok()) << "the job should have failed";
  EXPECT_THAT(std::string(name.status().message()), HasSubstr("exit code 1"));

  const CommandResult list = cluster_->Loomctl({"list", "-o", "json"});
  const nlohmann::json jobs = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_EQ(jobs["jobs"].size(), 1u) << list.Describe();
  const std::string job_name = jobs["jobs"][0]["name"];
  auto final_job = cluster_->GetJob(job_name);
  ASSERT_TRUE(final_job.ok()) << final_job.status();
  EXPECT_EQ(final_job->state(), loom::v1::FAILED);
  EXPECT_EQ(final_job->generation(), 3);
  EXPECT_EQ(final_job->restart_count(), 2);
  EXPECT_EQ(CountTransitionsTo(*final_job, loom::v1::RESTARTING), 2)
      << ::testing::PrintToString(EventLines(*final_job));

  // Each generation started the whole gang, and found the previous one entirely stopped.
  std::vector<pid_t> all_pids;
  for (int g = 1; g <= 3; ++g) {
    const std::vector<StartedRank> ranks = Started(g);
    EXPECT_EQ(ranks.size(), 4u) << "generation " << g;
    for (const StartedRank& r : ranks) {
      all_pids.push_back(r.pid);
      EXPECT_TRUE(r.json["previous_generation_alive"].empty())
          << "generation " << g << " rank " << r.rank << " started while ranks of generation "
          << g - 1 << " still ran: " << r.json["previous_generation_alive"].dump();
      EXPECT_EQ(r.json["LOOM_JOB_GENERATION"], std::to_string(g));
    }
  }
  EXPECT_TRUE(Started(4).empty());
  EXPECT_TRUE(WaitForGone(all_pids, absl::Seconds(5)));

  // The exit reason (a signal) is in the events and in the final state reason.
  bool reason_found = false;
  for (const std::string& line : EventLines(*final_job)) {
    const std::string lower = absl::AsciiStrToLower(line);
    if (lower.find("signal") != std::string::npos || lower.find("sigsegv") != std::string::npos) {
      reason_found = true;
    }
  }
  EXPECT_TRUE(reason_found) << ::testing::PrintToString(EventLines(*final_job));
  const CommandResult get = cluster_->Loomctl({"get", job_name});
  EXPECT_EQ(get.exit_code, 0) << get.Describe();
  EXPECT_THAT(get.out, HasSubstr("FAILED"));
}

TEST_F(IntegrationTest, CrashInFirstGenerationOnlySucceedsAfterOneRestart) {
  const TestJob job{.name = "recovers",
                    .devices = 4,
                    .steps = 5,
                    .step_ms = 50,
                    .max_restarts = 2,
                    .backoff_seconds = 0.1,
                    .crash_rank = 3,
                    .crash_mode = "exit3",  // a crash by exit code: retryable too
                    .crash_generations = 1};
  auto name = Submit(job, {"--wait"});
  ASSERT_TRUE(name.ok()) << name.status();
  auto final_job = cluster_->GetJob(*name);
  ASSERT_TRUE(final_job.ok()) << final_job.status();
  EXPECT_EQ(final_job->state(), loom::v1::SUCCEEDED);
  EXPECT_EQ(final_job->generation(), 2);
  EXPECT_EQ(final_job->restart_count(), 1);
  EXPECT_EQ(Started(1).size(), 4u);
  ASSERT_EQ(Started(2).size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(Done(2, r)) << "rank " << r;
    EXPECT_FALSE(Done(1, r)) << "rank " << r << " of the failed generation ran to its end";
  }
  EXPECT_TRUE(Started(3).empty());
}

TEST_F(IntegrationTest, PermanentFailureFailsWithoutRestart) {
  const TestJob job{.name = "bad-config",
                    .devices = 4,
                    .steps = 20,
                    .step_ms = 50,
                    .max_restarts = 3,
                    .crash_rank = 0,
                    .crash_mode = "exit2"};
  auto name = Submit(job);
  ASSERT_TRUE(name.ok()) << name.status();
  const CommandResult watch = cluster_->Loomctl({"watch", *name});
  EXPECT_EQ(watch.exit_code, 1) << watch.Describe();
  auto final_job = cluster_->GetJob(*name);
  ASSERT_TRUE(final_job.ok()) << final_job.status();
  EXPECT_EQ(final_job->state(), loom::v1::FAILED);
  EXPECT_EQ(final_job->generation(), 1);
  EXPECT_EQ(final_job->restart_count(), 0);
  EXPECT_EQ(CountTransitionsTo(*final_job, loom::v1::RESTARTING), 0);
  EXPECT_TRUE(Started(2).empty());
  bool reason_found = false;
  for (const std::string& line : EventLines(*final_job)) {
    if (line.find("exit code 2") != std::string::npos) reason_found = true;
  }
  EXPECT_TRUE(reason_found) << ::testing::PrintToString(EventLines(*final_job));
  std::vector<pid_t> pids;
  for (const StartedRank& r : Started(1)) pids.push_back(r.pid);
  EXPECT_TRUE(WaitForGone(pids, absl::Seconds(5)));
}

}  // namespace
}  // namespace loom::testing
