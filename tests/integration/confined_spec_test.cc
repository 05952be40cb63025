// Confined specs and validation parity on a real cluster: what loomd refuses at submit (loader
// variables in spec.env, counts beyond 2^53, an explicit lr of 0, a reused request_id), what the
// workers refuse on their own node (a data file outside their roots, named but never echoed),
// and ranks that run as an unprivileged user when the workers run as root.
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Spec(const std::string& extra) {
  return "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\nresources: {cpu_devices: 2}\n" +
         extra;
}

TEST_F(IntegrationTest, DangerousOrImpossibleSpecsAreRefusedAtSubmit) {
  struct Case {
    std::string what, yaml, field;
  };
  const std::vector<Case> cases = {
      {"LD_PRELOAD", Spec("train: {steps: 1}\nenv: {LD_PRELOAD: /tmp/evil.so}\n"),
       "spec.env[\"LD_PRELOAD\"]"},
      {"PATH", Spec("train: {steps: 1}\nenv: {PATH: /tmp}\n"), "spec.env[\"PATH\"]"},
      {"LD_LIBRARY_PATH", Spec("train: {steps: 1}\nenv: {LD_LIBRARY_PATH: /tmp}\n"),
       "spec.env[\"LD_LIBRARY_PATH\"]"},
      {"steps = 2^63-1", Spec("train: {steps: 9223372036854775807}\n"), "spec.train.steps"},
      {"lr: 0", Spec("train: {steps: 1, lr: 0}\n"), "spec.train.lr"},
      {"data path with ..",
       "model: {preset: tiny}\ndata: {path: /tmp/../etc/shadow}\n"
       "train: {steps: 1}\nresources: {cpu_devices: 2}\n",
       "spec.data.path"},
  };
  for (const Case& c : cases) {
    const std::string file = cluster_->WriteFile("bad.yaml", c.yaml);
    const CommandResult r = cluster_->Loomctl({"submit", "-f", file});
    EXPECT_EQ(r.exit_code, 2) << c.what << "\n" << r.Describe();
    EXPECT_THAT(r.err, HasSubstr(c.field)) << c.what;
  }
  EXPECT_TRUE(LoomctlJson({"list"})["jobs"].empty());
}

TEST_F(IntegrationTest, ARequestIdReusedWithAnotherSpecIsAnError) {
  const TestJob job{.name = "once", .devices = 2, .steps = 1, .step_ms = 10};
  auto first = Submit(job, {"--request-id", "it-reuse"});
  ASSERT_TRUE(first.ok()) << first.status();
  TestJob changed = job;
  changed.steps = 2;
  const std::string file = cluster_->WriteFile("changed.yaml", JobYaml(changed));
  const CommandResult r = cluster_->Loomctl({"submit", "-f", file, "--request-id", "it-reuse"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("different spec"));
  EXPECT_EQ(LoomctlJson({"list"})["jobs"].size(), 1u);
}

// loomd (no --data-roots here) accepts the path without opening it; the worker refuses it as
// outside its roots, and the job's failure names the field but never the file's bytes or size.
TEST_F(IntegrationTest, ADataFileOutsideTheWorkersRootsFailsTheJobWithoutEchoingIt) {
  const std::string secret = "/etc/shadow";
  std::string first_line;
  std::getline(std::ifstream(secret), first_line);
  const std::string file =
      cluster_->WriteFile("shadow.yaml",
                          "model: {preset: tiny}\ndata: {path: /etc/shadow}\ntrain: {steps: 1}\n"
                          "resources: {cpu_devices: 2}\n");
  const CommandResult r = cluster_->Loomctl({"submit", "-f", file, "--wait"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  const nlohmann::json list = LoomctlJson({"list"});
  ASSERT_EQ(list["jobs"].size(), 1u);
  const std::string name = list["jobs"][0]["name"];
  absl::StatusOr<loom::v1::Job> job = cluster_->GetJob(name);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), loom::v1::FAILED);
  EXPECT_THAT(job->state_reason(), HasSubstr("spec.data.path"));
  EXPECT_THAT(job->state_reason(), HasSubstr("outside this worker's directories"));
  if (!first_line.empty()) {
    EXPECT_THAT(job->state_reason(), Not(HasSubstr(first_line.substr(0, 8))));
  }
  EXPECT_THAT(job->state_reason(), Not(HasSubstr("bytes")));

  // A missing file under the roots: the worker says so, and the job fails at once.
  const std::string missing = cluster_->WriteFile(
      "missing.yaml",
      absl::StrCat("model: {preset: tiny}\ndata: {path: ", cluster_->dir(),
                   "/no-such.bin}\ntrain: {steps: 1}\nresources: {cpu_devices: 2}\n"));
  const CommandResult m = cluster_->Loomctl({"submit", "-f", missing, "--wait"});
  EXPECT_EQ(m.exit_code, 1) << m.Describe();
}

class RankUserTest : public IntegrationTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "ranks run as another user only under a root worker";
    ClusterOptions options;
    options.rank_user = "nobody";
    cluster_ = std::make_unique<Cluster>(options);
    const absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
};

TEST_F(RankUserTest, RanksOfARootWorkerRunAsNobodyAndOwnTheirFolders) {
  const TestJob job{.name = "unprivileged", .devices = 2, .steps = 2, .step_ms = 10};
  auto name = Submit(job, {"--wait"});
  ASSERT_TRUE(name.ok()) << name.status();
  const std::vector<StartedRank> ranks = Started(1);
  ASSERT_EQ(ranks.size(), 2u);
  for (const StartedRank& rank : ranks) {
    EXPECT_NE(rank.json.value("uid", 0L), 0L) << rank.json.dump();
    EXPECT_NE(rank.json.value("euid", 0L), 0L);
    EXPECT_TRUE(rank.json.value("LOOM_WORK_DIR_writable", false)) << rank.json.dump();
    EXPECT_TRUE(rank.json.value("LOOM_CHECKPOINT_DIR_writable", false)) << rank.json.dump();
  }
}

}  // namespace
}  // namespace loom::testing
