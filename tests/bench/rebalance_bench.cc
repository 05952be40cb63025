// The doctor's closed loop, measured (issue 12, "the reference case"): a head-heavy pipeline,
// evenly split, trained through loomd and a worker with real loom-train ranks, twice side by
// side in one run:
//   - `auto`: rebalance auto re-splits it from the measured per-block costs, resumes from the
//     checkpoint and verifies (the event's "step A s with [new] against B s with [old]");
//   - `off`: the same job, same seed and data, never re-split.
// It prints the step time before and after the re-split (medians over the verify windows, from
// the event), the gain, and the largest relative difference of rank 0's loss between the two
// runs at every step both trained: the loss curve continues across the re-split (layout
// invariance: the same seed, data and global batch give the same losses under every split).
//
// The machine matters: a pipeline stage that waits gives its core to the others only when ranks
// outnumber cores, which hides the imbalance (the step is then bound by the total work over the
// cores). So the default is 2 stages on 2 devices, one thread each (OMP_NUM_THREADS=1), for a
// 2-core machine; `--data 2 --stages 4` is the reference layout (8 ranks: it needs 8
// free cores). A re-split can save at most (m - 1)/m of the bottleneck's reduction with m
// micro-batches (the fill and drain stay), so more micro-batches show more of the gain.
//
// Run: build/bin/rebalance_bench [--data 1] [--stages 2] [--layers 8] [--hidden 128]
//        [--vocab 16384] [--micro-batches 8] [--steps 160]
// (after scripts/build.sh; it starts its own cluster in a temp dir, about four minutes).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/integration/cluster.h"

namespace {

using loom::testing::Cluster;
using loom::testing::ClusterOptions;
using loom::testing::CommandResult;

struct Args {
  // The defaults make the head (vocab 16,384) about seven blocks' worth, so the even split leaves
  // the first stage idle most of the step (docs/benchmarks.md, 2026-12-05).
  int data = 1, stages = 2, layers = 8, hidden = 128, vocab = 16384, micro_batches = 8, steps = 160;
};

std::string Spec(const Args& a, const std::string& name, const std::string& mode) {
  std::string blocks;
  for (int s = 0; s < a.stages; ++s) absl::StrAppend(&blocks, s ? ", " : "", a.layers / a.stages);
  return absl::StrCat("name: ", name, "\n", "model: {layers: ", a.layers, ", hidden: ", a.hidden,
                      ", heads: 4, seq_len: 64, vocab: ", a.vocab, "}\n",
                      "data: {builtin: tiny-corpus}\n", "train: {steps: ", a.steps,
                      // micro-batches of 4 sequences of 64 tokens on each data-parallel replica
                      ", global_batch_tokens: ", a.data * a.micro_batches * 4 * 64,
                      ", lr: 1.0e-3, seed: 7}\n", "resources: {cpu_devices: ", a.data * a.stages,
                      "}\n", "parallelism: {data: ", a.data, ", tensor: 1, pipeline: ", a.stages,
                      ", micro_batch: 4, blocks_per_stage: [", blocks, "]}\n",
                      "checkpoint: {every_steps: 8}\n", "rebalance: {mode: ", mode, "}\n",
                      "env: {OMP_NUM_THREADS: 1, OPENBLAS_NUM_THREADS: 1}\n");
}

// step -> rank 0's loss, from the job's logs (the last generation that trained a step wins).
std::map<long, double> Losses(Cluster& cluster, const std::string& job) {
  std::map<long, double> out;
  const CommandResult logs = cluster.Loomctl({"logs", job});
  for (absl::string_view line : absl::StrSplit(logs.out, '\n')) {
    const size_t brace = line.find("{\"event\":\"step\",\"rank\":0,");
    if (brace == absl::string_view::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line.substr(brace), nullptr, false);
    if (j.is_discarded() || !j.contains("step") || !j.contains("loss")) continue;
    out[j["step"].get<long>()] = j["loss"].get<double>();
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    int v = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &v) || v <= 0) {
      std::fprintf(stderr, "rebalance_bench: %s needs a positive integer\n", flag.c_str());
      return 2;
    }
    if (flag == "--data")
      a.data = v;
    else if (flag == "--stages")
      a.stages = v;
    else if (flag == "--hidden")
      a.hidden = v;
    else if (flag == "--micro-batches")
      a.micro_batches = v;
    else if (flag == "--layers")
      a.layers = v;
    else if (flag == "--vocab")
      a.vocab = v;
    else if (flag == "--steps")
      a.steps = v;
    else {
      std::fprintf(stderr, "rebalance_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  Cluster cluster(ClusterOptions{
      .workers = 1, .cpu_devices_per_worker = a.data * a.stages, .rank_program = "loom-train"});
  if (absl::Status st = cluster.Start(); !st.ok()) {
    std::fprintf(stderr, "rebalance_bench: cluster: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::map<std::string, std::string> jobs;
  std::map<std::string, loom::v1::Job> finished;
  // One after the other, so that they do not share the cores.
  for (const std::string mode : {"auto", "off"}) {
    const std::string file = cluster.WriteFile(mode + ".yaml", Spec(a, "rebalance-" + mode, mode));
    const CommandResult submit = cluster.Loomctl({"submit", "-f", file});
    if (submit.exit_code != 0) {
      std::fprintf(stderr, "rebalance_bench: submit: %s\n", submit.Describe().c_str());
      return 1;
    }
    const std::string job = submit.out.substr(0, submit.out.find('\n'));
    absl::StatusOr<loom::v1::Job> done = cluster.WaitForJob(
        job,
        [](const loom::v1::Job& j) {
          return j.state() >= loom::v1::SUCCEEDED && j.state() != loom::v1::RESTARTING;
        },
        absl::Minutes(10));
    if (!done.ok() || done->state() != loom::v1::SUCCEEDED) {
      std::fprintf(stderr, "rebalance_bench: %s did not succeed: %s\n%s", job.c_str(),
                   std::string(done.status().message()).c_str(), cluster.LogTails().c_str());
      return 1;
    }
    jobs[mode] = job;
    finished[mode] = *done;
  }
  std::string resplit, verified, finding;
  for (const auto& e : finished["auto"].events()) {
    // The first raise: why there was (or was not) a split to apply.
    if (finding.empty() && e.reason().find("doctor: raised STAGE_IMBALANCE") != std::string::npos) {
      finding = e.reason();
    }
    if (e.reason().find("doctor: rebalance 1 of") != std::string::npos) resplit = e.reason();
    if (e.reason().find("doctor: rebalance verified") != std::string::npos) verified = e.reason();
  }
  std::printf(
      "layout: data %d x pipeline %d, %d micro-batches, %d blocks of C=%d, vocab %d, %d steps, "
      "1 thread per rank\n",
      a.data, a.stages, a.micro_batches, a.layers, a.hidden, a.vocab, a.steps);
  std::printf("finding: %s\n", finding.empty() ? "(none)" : finding.c_str());
  std::printf("re-split: %s\nverified: %s\n", resplit.empty() ? "(none)" : resplit.c_str(),
              verified.empty() ? "(none)" : verified.c_str());
  // "step A s with [..] against B s with [..]"
  double after = 0, before = 0;
  if (const size_t p = verified.find("step "); p != std::string::npos) {
    std::sscanf(verified.c_str() + p, "step %lf s with", &after);
    if (const size_t q = verified.find("against ", p); q != std::string::npos) {
      std::sscanf(verified.c_str() + q, "against %lf s", &before);
    }
  }
  if (before > 0 && after > 0) {
    std::printf("step: %.4f s before, %.4f s after: %.1f%% faster\n", before, after,
                (1 - after / before) * 100);
  }
  const std::map<long, double> with = Losses(cluster, jobs["auto"]);
  const std::map<long, double> without = Losses(cluster, jobs["off"]);
  double worst = 0;
  long compared = 0, worst_step = 0, first_apart = 0;
  for (const auto& [step, loss] : with) {
    auto it = without.find(step);
    if (it == without.end()) continue;
    ++compared;
    const double diff = std::abs(loss - it->second) / std::max(1e-12, std::abs(it->second));
    if (diff > 1e-5 && first_apart == 0) first_apart = step;
    if (diff > worst) {
      worst = diff;
      worst_step = step;
    }
  }
  std::printf(
      "loss: %ld steps compared, largest relative difference %.2e at step %ld (auto vs off); "
      "first step apart by more than 1e-5: %ld (0: none)\n",
      compared, worst, worst_step, first_apart);
  std::printf("goodput: auto %.2f, off %.2f\n", finished["auto"].goodput().ratio(),
              finished["off"].goodput().ratio());
  cluster.Shutdown();
  return 0;
}
