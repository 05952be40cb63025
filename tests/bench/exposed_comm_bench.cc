// The doctor's EXPOSED_COMMUNICATION finding, and what its fix is worth (issue 12): a
// data-parallel job whose gradient buckets are far too small (spec.parallelism.dp_bucket_mb
// 0.01: hundreds of all-reduces per step, each paying its latency) runs through loomd and a
// worker with real loom-train ranks; the bench reads the finding the doctor raised from the
// job's events, applies the bucket size its fix names to a copy of the job, runs that, and
// prints both jobs' median step and exposed communication (rank 0, after warm-up).
//
// The fix is taken from the finding's text, not from this file: if the doctor advised something
// else, the bench says so and fails.
//
// Run: build/bin/exposed_comm_bench [--steps 160] (after scripts/build.sh; about a minute).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/integration/cluster.h"

namespace {

using loom::testing::Cluster;
using loom::testing::ClusterOptions;
using loom::testing::CommandResult;

std::string Spec(const std::string& name, const std::string& bucket_mb, int steps) {
  return absl::StrCat(
      "name: ", name, "\n", "model: {layers: 4, hidden: 128, heads: 4, seq_len: 64, vocab: 4096}\n",
      "data: {builtin: tiny-corpus}\n", "train: {steps: ", steps,
      ", global_batch_tokens: 512, lr: 1.0e-3, seed: 7}\n", "resources: {cpu_devices: 2}\n",
      "parallelism: {data: 2, tensor: 1, pipeline: 1, micro_batch: 4, dp_bucket_mb: ", bucket_mb,
      "}\n", "env: {OMP_NUM_THREADS: 1, OPENBLAS_NUM_THREADS: 1}\n");
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Figures {
  double step = 0, exposed = 0;
  size_t steps = 0;
};

// Rank 0's median step and exposed communication over its steps after the first 10.
Figures RankZero(Cluster& cluster, const std::string& job) {
  std::vector<double> step, exposed;
  const CommandResult logs = cluster.Loomctl({"logs", job});
  for (absl::string_view line : absl::StrSplit(logs.out, '\n')) {
    const size_t brace = line.find("{\"event\":\"step\",\"rank\":0,");
    if (brace == absl::string_view::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line.substr(brace), nullptr, false);
    if (j.is_discarded() || !j.contains("step") || j["step"].get<long>() <= 10) continue;
    if (!j.contains("step_seconds") || !j.contains("phases")) continue;
    step.push_back(j["step_seconds"].get<double>());
    exposed.push_back(j["phases"].value("comm_exposed", 0.0));
  }
  return Figures{Median(step), Median(exposed), step.size()};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 160;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) != "--steps" || !absl::SimpleAtoi(argv[i + 1], &steps) || steps < 40) {
      std::fprintf(stderr, "exposed_comm_bench: usage: exposed_comm_bench [--steps N >= 40]\n");
      return 2;
    }
  }
  Cluster cluster(
      ClusterOptions{.workers = 1, .cpu_devices_per_worker = 2, .rank_program = "loom-train"});
  if (absl::Status st = cluster.Start(); !st.ok()) {
    std::fprintf(stderr, "exposed_comm_bench: cluster: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  auto run = [&](const std::string& name, const std::string& bucket_mb, loom::v1::Job* out) {
    const std::string file = cluster.WriteFile(name + ".yaml", Spec(name, bucket_mb, steps));
    const CommandResult submit = cluster.Loomctl({"submit", "-f", file});
    if (submit.exit_code != 0) {
      std::fprintf(stderr, "exposed_comm_bench: submit: %s\n", submit.Describe().c_str());
      return std::string();
    }
    const std::string job = submit.out.substr(0, submit.out.find('\n'));
    absl::StatusOr<loom::v1::Job> done = cluster.WaitForJob(
        job, [](const loom::v1::Job& j) { return j.state() >= loom::v1::SUCCEEDED; },
        absl::Minutes(10));
    if (!done.ok() || done->state() != loom::v1::SUCCEEDED) {
      std::fprintf(stderr, "exposed_comm_bench: %s did not succeed\n%s", job.c_str(),
                   cluster.LogTails().c_str());
      return std::string();
    }
    *out = *done;
    return job;
  };

  loom::v1::Job tiny_job, fixed_job;
  const std::string tiny = run("buckets-tiny", "0.01", &tiny_job);
  if (tiny.empty()) return 1;
  // The last EXPOSED_COMMUNICATION finding among a job's events, or "".
  auto last_finding = [](const loom::v1::Job& job) {
    std::string found;
    for (const auto& e : job.events()) {
      if (e.reason().find("doctor: raised EXPOSED_COMMUNICATION") != std::string::npos) {
        found = e.reason();
      }
    }
    return found;
  };
  const std::string finding = last_finding(tiny_job);
  std::printf("finding: %s\n", finding.empty() ? "(none)" : finding.c_str());
  const std::string key = "set spec.parallelism.dp_bucket_mb to ";
  const size_t at = finding.find(key);
  if (at == std::string::npos) {
    std::fprintf(stderr, "exposed_comm_bench: the doctor did not advise a bucket size\n");
    return 1;
  }
  std::string advised = finding.substr(at + key.size());
  advised = advised.substr(0, advised.find_first_of(" ;"));
  const std::string fixed = run("buckets-fixed", advised, &fixed_job);
  if (fixed.empty()) return 1;
  // What the doctor says about the fixed job, if it still waits: the advice must not swing back.
  const std::string after_finding = last_finding(fixed_job);
  std::printf("finding after the fix: %s\n",
              after_finding.empty() ? "(none)" : after_finding.c_str());
  const Figures before = RankZero(cluster, tiny), after = RankZero(cluster, fixed);
  std::printf("dp_bucket_mb 0.01: step %.4f s, exposed %.4f s (%.0f%%), %zu steps\n", before.step,
              before.exposed, 100 * before.exposed / std::max(1e-12, before.step), before.steps);
  std::printf("dp_bucket_mb %s (the fix): step %.4f s, exposed %.4f s (%.0f%%), %zu steps\n",
              advised.c_str(), after.step, after.exposed,
              100 * after.exposed / std::max(1e-12, after.step), after.steps);
  std::printf("exposed communication %.1f%% lower, step %.1f%% shorter\n",
              100 * (1 - after.exposed / std::max(1e-12, before.exposed)),
              100 * (1 - after.step / std::max(1e-12, before.step)));
  cluster.Shutdown();
  return 0;
}
