// Faults of the cluster itself: loomd killed mid-job and restarted on its state, and a worker
// that stops heartbeating (SIGSTOP) and comes back (SIGCONT).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(IntegrationTest, LoomdKilledMidJobRestartsAndTheJobCompletesOnce) {
  const TestJob job{.name = "survives", .devices = 4, .steps = 40, .step_ms = 150};
  auto name = Submit(job);
  ASSERT_TRUE(name.ok()) << name.status();
  ASSERT_TRUE(WaitForStarted(1, 4, absl::Seconds(20)));
  auto progressing = cluster_->WaitForJob(
      *name,
      [](const loom::v1::Job& j) {
        return j.state() == loom::v1::RUNNING && j.progress().step() >= 2;
      },
      absl::Seconds(15));
  ASSERT_TRUE(progressing.ok()) << progressing.status();

  const int port = cluster_->loomd_port();
  cluster_->loomd().Kill();  // SIGKILL: no chance to clean up
  const absl::Status restarted = cluster_->StartLoomd(port);
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_EQ(cluster_->loomd_port(), port);

  auto known = cluster_->GetJob(*name);
  ASSERT_TRUE(known.ok()) << "the restarted loomd lost the job: " << known.status();
  EXPECT_FALSE(known->state() == loom::v1::FAILED) << known->state_reason();

  auto done = cluster_->WaitForJob(
      *name,
      [](const loom::v1::Job& j) {
        return (j.state() == loom::v1::SUCCEEDED || j.state() == loom::v1::FAILED ||
                j.state() == loom::v1::CANCELLED);
      },
      absl::Seconds(45));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), loom::v1::SUCCEEDED) << done->state_reason();
  EXPECT_EQ(done->generation(), 1);
  EXPECT_EQ(Started(1).size(), 4u) << "a rank was launched twice";
  EXPECT_TRUE(Started(2).empty()) << "the gang was relaunched";
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(Done(1, r)) << "rank " << r;
  const nlohmann::json got = LoomctlJson({"get", *name});
  EXPECT_EQ(got["state"], "SUCCEEDED");
}

TEST_F(IntegrationTest, StoppedWorkerBecomesLostWithinTheTimeout) {
  auto node_state = [&](const std::string& node) -> std::string {
    const CommandResult r = cluster_->Loomctl({"nodes", "-o", "json"});
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    if (r.exit_code != 0 || !j.is_object()) return "loomctl failed: " + r.Describe();
    for (const auto& n : j["nodes"]) {
      if (n["name"] == node) return n["state"];
    }
    return "absent";
  };
  ASSERT_EQ(node_state("nodes/worker-1"), "NODE_STATE_READY");
  const absl::Time stopped_at = absl::Now();
  cluster_->worker(1).Signal(SIGSTOP);
  // --node-timeout-ms=2000, heartbeats every 200 ms: LOST after about 2 s; allow scheduling
  // slack on a loaded machine, but no more.
  EXPECT_TRUE(WaitFor([&] { return node_state("nodes/worker-1") == "NODE_STATE_LOST"; },
                      absl::Seconds(6), absl::Milliseconds(100)))
      << "worker-1 is " << node_state("nodes/worker-1") << " after "
      << absl::FormatDuration(absl::Now() - stopped_at);
  EXPECT_GE(absl::Now() - stopped_at, absl::Milliseconds(1500)) << "LOST before the timeout";
  EXPECT_EQ(node_state("nodes/worker-0"), "NODE_STATE_READY");
  // Resumed, the worker heartbeats again (or re-registers) and its node is READY again.
  cluster_->worker(1).Signal(SIGCONT);
  EXPECT_TRUE(WaitFor([&] { return node_state("nodes/worker-1") == "NODE_STATE_READY"; },
                      absl::Seconds(10), absl::Milliseconds(100)))
      << "worker-1 is " << node_state("nodes/worker-1") << " after SIGCONT";
}

}  // namespace
}  // namespace loom::testing
