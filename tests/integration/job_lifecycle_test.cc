// Jobs from submit to their end on a real cluster: success across both workers, cancellation,
// rejected input, idempotent submission, and the standard gRPC services.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/grpc_probe.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(IntegrationTest, SubmitWaitSucceedsAcrossBothWorkers) {
  const TestJob job{.name = "four-ranks", .devices = 4, .steps = 5, .step_ms = 100};
  const std::string file = cluster_->WriteFile("job.yaml", JobYaml(job));
  const CommandResult submit = cluster_->Loomctl({"submit", "-f", file, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.Describe();
  const std::string name = submit.out.substr(0, submit.out.find('\n'));
  EXPECT_THAT(name, ::testing::StartsWith("jobs/"));
  EXPECT_THAT(submit.out, HasSubstr(name + " SUCCEEDED"));

  // Every rank ran once, with a consistent rank environment, on both nodes.
  const std::vector<StartedRank> ranks = Started(1);
  ASSERT_EQ(ranks.size(), 4u);
  std::set<std::string> node_ranks;
  for (int r = 0; r < 4; ++r) {
    const nlohmann::json& env = ranks[r].json;
    EXPECT_EQ(ranks[r].rank, r);
    EXPECT_EQ(env["LOOM_JOB"], name);
    EXPECT_EQ(env["LOOM_WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOOM_NUM_NODES"], "2");
    EXPECT_EQ(env["LOOM_LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOOM_PROGRESS_FD"], "3");
    EXPECT_THAT(env["LOOM_DEVICE"].get<std::string>(), ::testing::MatchesRegex("cpu:[01]"));
    EXPECT_THAT(env["LOOM_LAYOUT"].get<std::string>(), HasSubstr("data=4,tensor=1,pipeline=1"));
    node_ranks.insert(env["LOOM_NODE_RANK"].get<std::string>());
    EXPECT_TRUE(Done(1, r)) << "rank " << r;
  }
  EXPECT_EQ(node_ranks, (std::set<std::string>{"0", "1"}));
  EXPECT_TRUE(Started(2).empty());

  const nlohmann::json got = LoomctlJson({"get", name});
  EXPECT_EQ(got["state"], "SUCCEEDED");
  EXPECT_EQ(got["progress"]["step"], "5");
  EXPECT_EQ(got["progress"]["step"], got["progress"]["totalSteps"]);

  const CommandResult logs = cluster_->Loomctl({"logs", name});
  ASSERT_EQ(logs.exit_code, 0) << logs.Describe();
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("[gen 1 rank ", r, "] test_rank ", r,
                                                 ": started generation 1")));
    EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("[gen 1 rank ", r, " stderr] test_rank ", r,
                                                 ": a line on stderr")));
  }
  const CommandResult rank2 = cluster_->Loomctl({"logs", name, "--rank", "2"});
  ASSERT_EQ(rank2.exit_code, 0) << rank2.Describe();
  EXPECT_THAT(rank2.out, HasSubstr("test_rank 2: done"));
  EXPECT_THAT(rank2.out, Not(HasSubstr("rank 0]")));

  const CommandResult list = cluster_->Loomctl({"list", "--state", "succeeded"});
  ASSERT_EQ(list.exit_code, 0) << list.Describe();
  EXPECT_THAT(list.out, HasSubstr(name));
}

class CancelTest : public IntegrationTest {
 protected:
  // Cancels a running job and checks that every rank process is gone within 5 s; with
  // `ignore_term` the ranks ignore SIGTERM, so the worker must escalate to SIGKILL.
  void CancelWhileRunning(bool ignore_term) {
    const TestJob job{
        .name = "long", .devices = 4, .steps = 100000, .step_ms = 100, .ignore_term = ignore_term};
    absl::StatusOr<std::string> name = Submit(job);
    ASSERT_TRUE(name.ok()) << name.status();
    ASSERT_TRUE(WaitForStarted(1, 4, absl::Seconds(20)))
        << "only " << Started(1).size() << " of 4 ranks started";
    auto running = cluster_->WaitForJob(
        *name, [](const loom::v1::Job& j) { return j.state() == loom::v1::RUNNING; },
        absl::Seconds(10));
    ASSERT_TRUE(running.ok()) << running.status();
    std::vector<pid_t> pids;
    for (const StartedRank& r : Started(1)) pids.push_back(r.pid);

    const CommandResult cancel = cluster_->Loomctl({"cancel", *name});
    ASSERT_EQ(cancel.exit_code, 0) << cancel.Describe();
    EXPECT_TRUE(WaitForGone(pids, absl::Seconds(5))) << "rank processes outlived the cancel by 5 s";
    auto cancelled = cluster_->WaitForJob(
        *name, [](const loom::v1::Job& j) { return j.state() == loom::v1::CANCELLED; },
        absl::Seconds(10));
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    // watch on a cancelled job ends at once, with exit code 1.
    const CommandResult watch = cluster_->Loomctl({"watch", *name});
    EXPECT_EQ(watch.exit_code, 1) << watch.Describe();
    EXPECT_THAT(watch.out, HasSubstr("CANCELLED"));
  }
};

TEST_F(CancelTest, CancelStopsEveryRankWithin5s) { CancelWhileRunning(/*ignore_term=*/false); }

TEST_F(CancelTest, CancelKillsRanksThatIgnoreSigterm) { CancelWhileRunning(/*ignore_term=*/true); }

TEST_F(IntegrationTest, BadInputIsExit2NamingTheFieldAndCreatesNoJob) {
  const std::string env = absl::StrCat("env: {TEST_RANK_OUT_DIR: ", cluster_->out_dir(), "}\n");
  struct Case {
    std::string what;
    std::string yaml;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"zero devices",
       "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 1}\n"
       "resources: {cpu_devices: 0}\n",
       "spec.resources"},
      {"more devices than the cluster",
       "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 1}\n"
       "resources: {cpu_devices: 64}\n",
       "spec.resources.cpu_devices"},
      {"unknown preset",
       "model: {preset: gpt5}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 1}\n"
       "resources: {cpu_devices: 2}\n",
       "spec.model.preset"},
      {"layout product differs from the devices",
       "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 1}\n"
       "resources: {cpu_devices: 4}\nparallelism: {data: 2, tensor: 1, pipeline: 1}\n",
       "spec.parallelism"},
      {"tensor does not divide the heads",
       "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 1}\n"
       "resources: {cpu_devices: 3}\nparallelism: {data: 1, tensor: 3, pipeline: 1}\n",
       "spec.parallelism.tensor"},
      {"YAML syntax error (caught by loomctl)", "model: {preset: tiny\ntrain: {steps: 1}\n",
       "bad.yaml:2:6: YAML syntax error"},
      {"unknown key (caught by loomctl)", "model: {preset: tiny}\nresources: {cpu_devcies: 2}\n",
       "bad.yaml:2:13: resources.cpu_devcies: unknown key; did you mean 'cpu_devices'?"},
  };
  for (const Case& c : cases) {
    const std::string file = cluster_->WriteFile("bad.yaml", c.yaml + env);
    const CommandResult r = cluster_->Loomctl({"submit", "-f", file});
    EXPECT_EQ(r.exit_code, 2) << c.what << "\n" << r.Describe();
    EXPECT_THAT(r.err, HasSubstr(c.field)) << c.what;
    EXPECT_THAT(r.err, Not(HasSubstr("INTERNAL"))) << c.what;
  }
  const nlohmann::json list = LoomctlJson({"list"});
  EXPECT_TRUE(list["jobs"].empty()) << list.dump(2);
}

TEST_F(IntegrationTest, SubmitWithTheSameRequestIdCreatesOneJob) {
  const TestJob job{.name = "once", .devices = 2, .steps = 1, .step_ms = 10};
  auto first = Submit(job, {"--request-id", "it-request-1"});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Submit(job, {"--request-id", "it-request-1"});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  const nlohmann::json list = LoomctlJson({"list"});
  ASSERT_EQ(list["jobs"].size(), 1u) << list.dump(2);
  EXPECT_EQ(list["jobs"][0]["name"], *first);
  EXPECT_EQ(list["jobs"][0]["requestId"], "it-request-1");

  auto other = Submit(job, {"--request-id", "it-request-2"});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(*other, *first);
  EXPECT_EQ(LoomctlJson({"list"})["jobs"].size(), 2u);
}

TEST_F(IntegrationTest, HealthAndReflectionRespondOnBothDaemons) {
  auto health = HealthCheck(cluster_->channel(), "");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 1) << "grpc.health.v1 Check: expected SERVING (1)";
  auto services = ReflectionListServices(cluster_->channel());
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services,
              ::testing::IsSupersetOf({"loom.v1.JobService", "loom.v1.NodeService",
                                       "loom.v1.RendezvousService", "grpc.health.v1.Health"}));

  auto worker =
      grpc::CreateChannel(cluster_->worker_address(0), grpc::InsecureChannelCredentials());
  auto worker_health = HealthCheck(worker, "");
  ASSERT_TRUE(worker_health.ok()) << worker_health.status();
  EXPECT_EQ(*worker_health, 1);
  auto worker_services = ReflectionListServices(worker);
  ASSERT_TRUE(worker_services.ok()) << worker_services.status();
  EXPECT_THAT(*worker_services, ::testing::Contains("grpc.health.v1.Health"));
}

TEST_F(IntegrationTest, UnreachableServerIsExit3) {
  const CommandResult r =
      RunCommand({cluster_->loomctl_path(), "--server", "127.0.0.1:1", "nodes"}, absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 3) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("cannot reach loomd at 127.0.0.1:1"));
}

}  // namespace
}  // namespace loom::testing
