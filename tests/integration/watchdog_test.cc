// Watchdogs and drains on a real cluster (loomd, two workers, test_rank): a stopped (SIGSTOP)
// rank is found by the progress watchdog, reported as not answering its stack dump with state
// T, and the gang restarts; a worker stopped with SIGTERM drains its node and its gang moves to
// the other node without spending a restart; loomd refuses a lost database over a state dir
// that held jobs.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

std::string Reasons(const loom::v1::Job& job) {
  std::vector<std::string> reasons;
  for (const auto& e : job.events()) reasons.push_back(e.reason());
  return absl::StrJoin(reasons, "\n");
}

class WatchdogTest : public IntegrationTest {
 protected:
  ClusterOptions Options() const override {
    ClusterOptions options;
    options.loomd_flags = {"--progress-timeout-floor-ms=2000", "--progress-timeout-factor=5",
                           "--startup-allowance-ms=20000", "--drain-requeue-delay-ms=500"};
    options.worker_flags = {"--fence-timeout-ms=2000"};
    return options;
  }
};

// The issue: a stopped rank in a larger job was noticed only at the 120 s collective timeout
// (and a stopped single-rank job never).
TEST_F(WatchdogTest, AStoppedRankIsFoundDumpedAndTheGangRestarts) {
  const TestJob job{
      .name = "stopped", .devices = 2, .steps = 2000, .step_ms = 50, .max_restarts = 1};
  absl::StatusOr<std::string> name = Submit(job);
  ASSERT_TRUE(name.ok()) << name.status();
  ASSERT_TRUE(WaitForStarted(1, 2, absl::Seconds(20)));
  ASSERT_TRUE(cluster_
                  ->WaitForJob(
                      *name, [](const loom::v1::Job& j) { return j.progress().step() >= 3; },
                      absl::Seconds(20))
                  .ok());
  const std::vector<StartedRank> ranks = Started(1);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(::kill(ranks[1].pid, SIGSTOP), 0);
  const absl::Time stopped_at = absl::Now();

  absl::StatusOr<loom::v1::Job> restarted = cluster_->WaitForJob(
      *name, [](const loom::v1::Job& j) { return j.generation() >= 2; }, absl::Seconds(30));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_LT(absl::Now() - stopped_at, absl::Seconds(15)) << "well before a collective timeout";
  const std::string reasons = Reasons(*restarted);
  EXPECT_THAT(reasons, HasSubstr("rank 1: no progress (step or checkpoint) for"));
  EXPECT_THAT(reasons, HasSubstr("did not answer, process state T (stopped)"));
  EXPECT_THAT(reasons, HasSubstr("rank 0 (pid"));  // rank 0 answered its dump
  EXPECT_EQ(restarted->restart_count(), 1);
  EXPECT_TRUE(WaitForGone({ranks[0].pid, ranks[1].pid}, absl::Seconds(15)))
      << "the stopped rank is killed with its gang";
  // Rank 0's dump is in the job's logs.
  const CommandResult logs = cluster_->Loomctl({"logs", *name});
  EXPECT_THAT(logs.out, HasSubstr("loom-train: stack dump (SIGUSR1)")) << logs.Describe();
  cluster_->Loomctl({"cancel", *name});
}

// A stopped worker drains: its gang goes back to the queue at once, without spending a restart
// (it has none), and runs on the other node.
TEST_F(WatchdogTest, AWorkerStoppedWithSigtermDrainsAndItsJobMoves) {
  const TestJob job{.name = "moves", .devices = 2, .steps = 2000, .step_ms = 50};
  absl::StatusOr<std::string> name = Submit(job);
  ASSERT_TRUE(name.ok()) << name.status();
  absl::StatusOr<loom::v1::Job> running = cluster_->WaitForJob(
      *name, [](const loom::v1::Job& j) { return j.state() == loom::v1::RUNNING; },
      absl::Seconds(20));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->placements_size(), 1);
  const std::string node = running->placements(0).node();
  const int index = node == "nodes/worker-0" ? 0 : 1;
  ASSERT_EQ(node, absl::StrCat("nodes/worker-", index));
  cluster_->worker(index).Signal(SIGTERM);

  absl::StatusOr<loom::v1::Job> moved = cluster_->WaitForJob(
      *name,
      [](const loom::v1::Job& j) { return j.generation() >= 2 && j.state() == loom::v1::RUNNING; },
      absl::Seconds(30));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->restart_count(), 0);
  EXPECT_NE(moved->placements(0).node(), node);
  EXPECT_THAT(Reasons(*moved), HasSubstr("is stopping (stopping on SIGTERM)"));
  EXPECT_THAT(Reasons(*moved), HasSubstr("not counted as a restart"));
  cluster_->Loomctl({"cancel", *name});
}

// The issue: a frozen worker's rank kept training unsupervised. Now it stops itself within the
// fence timeout while its worker is still stopped, and loomd restarts the gang elsewhere.
TEST_F(WatchdogTest, TheRanksOfAFrozenWorkerFenceThemselves) {
  const TestJob job{
      .name = "fenced", .devices = 2, .steps = 2000, .step_ms = 50, .max_restarts = 1};
  absl::StatusOr<std::string> name = Submit(job);
  ASSERT_TRUE(name.ok()) << name.status();
  ASSERT_TRUE(WaitForStarted(1, 2, absl::Seconds(20)));
  absl::StatusOr<loom::v1::Job> running = cluster_->GetJob(*name);
  ASSERT_TRUE(running.ok());
  const int index = running->placements(0).node() == "nodes/worker-0" ? 0 : 1;
  std::vector<pid_t> pids;
  for (const StartedRank& r : Started(1)) pids.push_back(r.pid);
  cluster_->worker(index).Signal(SIGSTOP);
  EXPECT_TRUE(WaitForGone(pids, absl::Seconds(10))) << "the ranks outlived their frozen worker";
  absl::StatusOr<loom::v1::Job> moved = cluster_->WaitForJob(
      *name, [](const loom::v1::Job& j) { return j.generation() >= 2; }, absl::Seconds(20));
  EXPECT_TRUE(moved.ok()) << moved.status();
  cluster_->worker(index).Signal(SIGCONT);
  cluster_->Loomctl({"cancel", *name});
}

// The issue: an empty loomd.db started a fresh coordinator that forgot every job.
TEST_F(WatchdogTest, LoomdRefusesAnEmptyDatabaseOverAStateDirThatHeldJobs) {
  absl::StatusOr<std::string> name = Submit({.name = "remembered", .devices = 1, .steps = 1});
  ASSERT_TRUE(name.ok()) << name.status();
  const std::string state = cluster_->dir() + "/state";
  cluster_->loomd().Stop(absl::Seconds(5));
  for (const char* suffix : {"-wal", "-shm", ""}) {
    std::filesystem::remove(state + "/loomd.db" + suffix);
  }
  std::ofstream(state + "/loomd.db").close();
  const CommandResult refused = RunCommand(
      {cluster_->loomctl_path().substr(0, cluster_->loomctl_path().rfind('/')) + "/loomd",
       "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--state-dir=" + state,
       "--insecure"},
      absl::Seconds(20));
  EXPECT_EQ(refused.exit_code, 1) << refused.Describe();
  EXPECT_THAT(refused.err, HasSubstr("--start-fresh")) << refused.Describe();
  EXPECT_EQ(std::filesystem::file_size(state + "/loomd.db"), 0u);
}

}  // namespace
}  // namespace loom::testing
