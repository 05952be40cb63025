// Timelines end to end (issue 12, part 6): loomd and a worker running real loom-train ranks of a
// data 2 x pipeline 2 job; `loomctl trace JOB --steps A:B -o FILE` writes a Chrome trace-event
// file that parses as JSON with one named process per rank, every event inside the step range,
// forward before backward for each micro-batch on a stage, the steps in order, and collectives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>

#include "absl/time/time.h"
#include "tests/integration/cluster.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

class TraceIntegrationTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!cluster_) return;
    if (HasFailure()) std::cerr << cluster_->LogTails();
    cluster_->Shutdown(/*keep_dir=*/HasFailure());
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(TraceIntegrationTest, DataTwoByPipelineTwoTimelineLoadsWithEveryRankInOrder) {
  cluster_ = std::make_unique<Cluster>(
      ClusterOptions{.workers = 1, .cpu_devices_per_worker = 4, .rank_program = "loom-train"});
  ASSERT_TRUE(cluster_->Start().ok());
  const std::string spec =
      cluster_->WriteFile("job.yaml",
                          "name: traced\n"
                          "model: {preset: tiny}\n"
                          "data: {builtin: tiny-corpus}\n"
                          "train: {steps: 5000, global_batch_tokens: 256, lr: 1.0e-3}\n"
                          "resources: {cpu_devices: 4}\n"
                          "parallelism: {data: 2, tensor: 1, pipeline: 2, micro_batch: 1}\n"
                          "env: {OMP_NUM_THREADS: 1, OPENBLAS_NUM_THREADS: 1}\n");
  const CommandResult submitted = cluster_->Loomctl({"submit", "-f", spec});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.Describe();
  const std::string job = submitted.out.substr(0, submitted.out.find('\n'));

  // Rank 0 past step 6, so that steps 3..5 are in every ring.
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<loom::v1::Job> j = cluster_->GetJob(job);
        return j.ok() && j->state() == loom::v1::RUNNING && j->progress().step() >= 6;
      },
      absl::Seconds(25), absl::Milliseconds(200)));

  // A bad range is refused before anything is fetched, naming the flag.
  const CommandResult bad = cluster_->Loomctl({"trace", job, "--steps", "5:3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--steps"));

  const std::string file = cluster_->WriteFile("trace.json", "");
  const CommandResult r = cluster_->Loomctl({"trace", job, "--steps", "3:5", "-o", file});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("4 rank(s)"));
  std::ifstream in(file);
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(trace.is_discarded()) << "not JSON";
  ASSERT_TRUE(trace.contains("traceEvents"));

  std::map<int, std::string> processes;  // pid -> name
  // (pid, step, micro) -> end of forward, start of backward
  std::map<std::tuple<int, int, int>, double> forward_end, backward_start;
  std::map<int, std::map<int, double>> step_start;  // pid -> step -> ts
  std::map<std::string, int> names;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    const int pid = e.at("pid").get<int>();
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") processes[pid] = e.at("args").at("name");
      continue;
    }
    ASSERT_EQ(e.at("ph"), "X") << e.dump();
    const int step = e.at("args").at("step").get<int>();
    EXPECT_GE(step, 3) << e.dump();
    EXPECT_LE(step, 5) << e.dump();
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    const std::string name = e.at("name");
    ++names[name];
    const double ts = e.at("ts").get<double>();
    const int micro = e.at("args").value("micro_batch", -1);
    if (name == "forward") forward_end[{pid, step, micro}] = ts + e.at("dur").get<double>();
    if (name == "backward") backward_start[{pid, step, micro}] = ts;
    if (name == "step") step_start[pid][step] = ts;
  }
  // One track (process) per rank, named with its coordinates and node.
  ASSERT_EQ(processes.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& n = processes[rank + 1];
    EXPECT_THAT(n, HasSubstr("rank " + std::to_string(rank) + " (stage " +
                             std::to_string(rank / 2) + ", dp " + std::to_string(rank % 2)));
    EXPECT_THAT(n, HasSubstr("on nodes/"));
  }
  // Each rank: 3 steps in order; K = 2 micro-batches (256 tokens / (T 64 x data 2 x micro 1)) per
  // step.
  for (const auto& [pid, steps] : step_start) {
    ASSERT_EQ(steps.size(), 3u) << "pid " << pid;
    EXPECT_LT(steps.at(3), steps.at(4));
    EXPECT_LT(steps.at(4), steps.at(5));
  }
  EXPECT_EQ(step_start.size(), 4u);
  EXPECT_EQ(forward_end.size(), 4u * 3u * 2u);
  ASSERT_EQ(backward_start.size(), forward_end.size());
  for (const auto& [key, end] : forward_end) {
    ASSERT_TRUE(backward_start.contains(key));
    EXPECT_LE(end, backward_start[key]) << "pid " << std::get<0>(key) << " step "
                                        << std::get<1>(key) << " micro " << std::get<2>(key);
  }
  // Collectives and waits of every kind this layout has.
  EXPECT_GT(names["dp_bucket_all_reduce"], 0);
  EXPECT_GT(names["world_all_reduce"], 0);
  EXPECT_GT(names["emb_all_reduce"], 0);
  EXPECT_GT(names["pp_recv_activation"], 0);
  EXPECT_GT(names["pp_recv_gradient"], 0);
  EXPECT_GT(names["optimizer"], 0);
  EXPECT_GT(names["data"], 0);

  EXPECT_EQ(cluster_->Loomctl({"cancel", job}).exit_code, 0);
}

}  // namespace
}  // namespace loom::testing

namespace loom::testing {
namespace {

// A script's `submit` then `trace`: the trace waits (--wait, default 120 s) until the job runs
// past the range instead of refusing a job that is not RUNNING yet.
TEST_F(TraceIntegrationTest, TraceRightAfterSubmitWaitsForTheSteps) {
  cluster_ = std::make_unique<Cluster>(
      ClusterOptions{.workers = 1, .cpu_devices_per_worker = 1, .rank_program = "loom-train"});
  ASSERT_TRUE(cluster_->Start().ok());
  const std::string spec =
      cluster_->WriteFile("job.yaml",
                          "name: traced-at-once\n"
                          "model: {preset: tiny}\n"
                          "data: {builtin: tiny-corpus}\n"
                          "train: {steps: 5000, global_batch_tokens: 256, lr: 1.0e-3}\n"
                          "resources: {cpu_devices: 1}\n"
                          "env: {OMP_NUM_THREADS: 1, OPENBLAS_NUM_THREADS: 1}\n");
  const CommandResult submitted = cluster_->Loomctl({"submit", "-f", spec});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.Describe();
  const std::string job = submitted.out.substr(0, submitted.out.find('\n'));
  const std::string file = cluster_->WriteFile("trace.json", "");
  const CommandResult r = cluster_->Loomctl({"trace", job, "--steps", "4:5", "-o", file});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("1 rank(s)"));
  std::ifstream in(file);
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(trace.is_discarded()) << "not JSON";
  std::set<int> steps;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.at("ph") == "X") steps.insert(e.at("args").at("step").get<int>());
  }
  EXPECT_EQ(steps, (std::set<int>{4, 5}));
}

}  // namespace
}  // namespace loom::testing
