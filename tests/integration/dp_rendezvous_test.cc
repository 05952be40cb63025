// The invariance principle end to end (DESIGN.md, "The invariance principle"; issue 4): a tiny
// GPT job with an explicit layout of data = 2, submitted through loomctl to loomd and two
// workers of one CPU device each, runs its two loom-train ranks on different nodes; they meet
// through loomd's RendezvousService (LOOM_RENDEZVOUS, scoped to the job and its generation),
// train to SUCCEEDED, and rank 0's per-step losses equal those of the same spec run as one
// standalone loom-train process, within relative 1e-5 (fp32: only the reduction order differs).
// The same for a pipeline of two stages, one per worker.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 20;

// The spec shared by both runs: 1024 tokens per step = 16 sequences of 64, in micro-batches of
// 2 (so 4 per data-parallel rank under data = 2, 8 standalone), one seed. `parallelism` and
// `resources` are the only lines that differ between the two runs.
std::string SpecYaml(const std::string& parallelism, int devices) {
  return absl::StrCat("name: tiny-dp2\n", "model: {preset: tiny}\n",
                      "data: {builtin: tiny-corpus}\n", "train: {steps: ", kSteps,
                      ", global_batch_tokens: 1024, lr: 3.0e-3, warmup_steps: 5, seed: 7}\n",
                      "resources: {cpu_devices: ", devices, "}\n", "parallelism: ", parallelism,
                      "\n", "restart: {max_restarts: 0}\n",
                      "env: {OMP_NUM_THREADS: 1, OPENBLAS_NUM_THREADS: 1}\n");
}

// The losses of the step lines ({"event":"step",...}) in `text`, by step (1-based); each line
// may carry a prefix (loomctl logs writes "[gen G rank R] " before the rank's line).
std::vector<double> StepLosses(const std::string& text) {
  std::vector<double> losses;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t at = line.find("{\"event\":\"step\"");
    if (at == std::string::npos) continue;
    const nlohmann::json step =
        nlohmann::json::parse(line.substr(at), nullptr, /*allow_exceptions=*/false);
    if (step.is_discarded() || !step.contains("step") || !step.contains("loss")) continue;
    const int n = step["step"].get<int>();
    if (n < 1) continue;
    if (losses.size() < static_cast<size_t>(n)) losses.resize(n, NAN);
    losses[n - 1] = step["loss"].get<double>();
  }
  return losses;
}

class DpRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(
        ClusterOptions{.workers = 2, .cpu_devices_per_worker = 1, .rank_program = "loom-train"});
    const absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  void TearDown() override {
    if (!cluster_) return;
    if (HasFailure()) std::cerr << cluster_->LogTails();
    cluster_->Shutdown(/*keep_dir=*/HasFailure());
  }

  // Submits the spec file `file`, waits for the job to end and expects it SUCCEEDED; returns
  // its name and sets `job` to its `loomctl get -o json`.
  std::string SubmitAndExpectSucceeded(const std::string& file, nlohmann::json* job) {
    const CommandResult submit =
        cluster_->Loomctl({"submit", "-f", file, "--wait"}, absl::Seconds(240));
    EXPECT_EQ(submit.exit_code, 0) << submit.Describe();
    const std::string name = submit.out.substr(0, submit.out.find('\n'));
    const CommandResult get = cluster_->Loomctl({"get", name, "-o", "json"});
    EXPECT_EQ(get.exit_code, 0) << get.Describe();
    *job = nlohmann::json::parse(get.out, nullptr, false);
    EXPECT_FALSE(job->is_discarded()) << get.out;
    if (!job->is_discarded()) {
      EXPECT_EQ((*job)["state"], "SUCCEEDED") << job->dump(2);
    }
    return name;
  }

  // The per-step losses of the same spec run as one standalone loom-train process (no layout,
  // no rendezvous): the reference both tests compare against.
  std::vector<double> OneProcessLosses() {
    const std::string one_file = cluster_->WriteFile("one.yaml", SpecYaml("{micro_batch: 2}", 1));
    const std::string bin_dir =
        cluster_->loomctl_path().substr(0, cluster_->loomctl_path().rfind('/'));
    EXPECT_EQ(setenv("OMP_NUM_THREADS", "1", 1), 0);
    EXPECT_EQ(setenv("OPENBLAS_NUM_THREADS", "1", 1), 0);
    const CommandResult one =
        RunCommand({bin_dir + "/loom-train", "--spec", one_file, "--quiet"}, absl::Seconds(240));
    EXPECT_EQ(one.exit_code, 0) << one.Describe();
    const std::vector<double> losses = StepLosses(one.out);
    EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps)) << one.Describe();
    return losses;
  }

  // Every step's loss of `through_loomd` equals the one-process run's within relative 1e-5;
  // prints the largest difference. `what` names the layout in messages.
  static void ExpectSameCurve(const std::vector<double>& through_loomd,
                              const std::vector<double>& one, const std::string& what) {
    ASSERT_EQ(through_loomd.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(one.size(), static_cast<size_t>(kSteps));
    double max_rel = 0.0;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(std::isfinite(through_loomd[s]) && std::isfinite(one[s])) << "step " << s + 1;
      const double rel = std::fabs(through_loomd[s] - one[s]) / std::max(std::fabs(one[s]), 1e-30);
      max_rel = std::max(max_rel, rel);
      EXPECT_LE(rel, 1e-5) << "step " << s + 1 << ": " << what << " through loomd "
                           << through_loomd[s] << " vs one process " << one[s];
    }
    std::printf(
        "%s through loomd vs one process: max relative loss difference %.3g over %d "
        "steps (first %.7f, last %.7f)\n",
        what.c_str(), max_rel, kSteps, one[0], one[kSteps - 1]);
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(DpRendezvousTest, TwoRanksOnTwoWorkersMeetThroughLoomdAndMatchOneProcess) {
  // Through loomd: one device per worker, so the scheduler must spread the two ranks.
  const std::string file =
      cluster_->WriteFile("dp2.yaml", SpecYaml("{data: 2, micro_batch: 2}", 2));
  nlohmann::json job;
  const std::string name = SubmitAndExpectSucceeded(file, &job);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(job["generation"], "1");  // met at the first try: no restart hid a failure

  // The ranks ran on two different nodes: the node of each rank's log lines (placements are
  // cleared once the job ends, the logs keep them).
  const CommandResult all_logs = cluster_->Loomctl({"logs", name, "-o", "json"});
  ASSERT_EQ(all_logs.exit_code, 0) << all_logs.Describe();
  std::map<int, std::set<std::string>> nodes_of_rank;
  std::istringstream json_lines(all_logs.out);
  for (std::string line; std::getline(json_lines, line);) {
    const nlohmann::json l = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (l.is_discarded() || !l.contains("node")) continue;
    nodes_of_rank[l.value("rank", 0)].insert(l["node"].get<std::string>());
  }
  ASSERT_EQ(nodes_of_rank.size(), 2u) << all_logs.out;
  ASSERT_EQ(nodes_of_rank[0].size(), 1u);
  ASSERT_EQ(nodes_of_rank[1].size(), 1u);
  EXPECT_NE(*nodes_of_rank[0].begin(), *nodes_of_rank[1].begin());

  const CommandResult logs = cluster_->Loomctl({"logs", name, "--rank", "0"});
  ASSERT_EQ(logs.exit_code, 0) << logs.Describe();
  // Each rank says how it met the others (loom-train's stderr).
  EXPECT_THAT(logs.out, HasSubstr("through loomd's RendezvousService at"));
  EXPECT_THAT(logs.out, HasSubstr("rank 0 of 2, data parallel 2"));
  const std::vector<double> dp2 = StepLosses(logs.out);
  ASSERT_EQ(dp2.size(), static_cast<size_t>(kSteps)) << logs.out;

  ExpectSameCurve(dp2, OneProcessLosses(), "data=2");
  // The model learned something: the last loss is below the first.
  EXPECT_LT(dp2[kSteps - 1], dp2[0]);
}

// Pipeline parallelism through loomd: `tiny` split into 2 stages of one block each (GPipe, to
// cover the schedule the job spec names), one rank per worker; the ranks build their
// per-dimension groups through loomd's store (each group under its own key prefix), and the
// last stage's losses equal one process's.
TEST_F(DpRendezvousTest, PipelineOfTwoStagesOnTwoWorkersMatchesOneProcess) {
  // Each stage writes its own checkpoint shard: the ranks need a checkpoint directory they all
  // see (checkpoint.dir; the default is private to each worker's node).
  const std::string shared = cluster_->dir() + "/pp2-checkpoints";
  const std::string file = cluster_->WriteFile(
      "pp2.yaml", SpecYaml("{pipeline: 2, micro_batch: 2, schedule: gpipe}", 2) +
                      "checkpoint: {dir: \"" + shared + "\"}\n");
  nlohmann::json job;
  const std::string name = SubmitAndExpectSucceeded(file, &job);
  ASSERT_FALSE(HasFailure());

  const CommandResult logs = cluster_->Loomctl({"logs", name, "--rank", "1"});
  ASSERT_EQ(logs.exit_code, 0) << logs.Describe();
  EXPECT_THAT(logs.out, HasSubstr("through loomd's RendezvousService at"));
  EXPECT_THAT(logs.out, HasSubstr("pp=2 (blocks 1/1)"));
  EXPECT_THAT(logs.out, HasSubstr("schedule gpipe"));
  EXPECT_THAT(logs.out, HasSubstr("this rank dp 0, tp 0, pp 1, blocks [1, 2)"));
  // The final checkpoint of both stages' shards, in the job's own folder of the directory both
  // ranks see.
  const std::string mine = shared + "/" + name.substr(name.find('/') + 1);
  EXPECT_TRUE(std::filesystem::exists(mine + "/step-000020/manifest.json")) << logs.out;
  EXPECT_TRUE(std::filesystem::exists(mine + "/step-000020/model-pp01-tp00.safetensors"));
  const std::vector<double> pp2 = StepLosses(logs.out);
  ASSERT_EQ(pp2.size(), static_cast<size_t>(kSteps)) << logs.out;

  ExpectSameCurve(pp2, OneProcessLosses(), "pipeline=2");
}

}  // namespace
}  // namespace loom::testing
