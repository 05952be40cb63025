// train_bench: training throughput of loom-train's CPU core, in tokens per second, for the
// presets tiny, small and gpt2-124m at B=4, T=64 (one micro-batch per step). Each figure is the
// median over several optimizer steps (forward, backward, AdamW) after warmup steps, measured by
// the trainer's own step profiler. Not a test: run by hand, record in docs/benchmarks.md.
//   train_bench [--steps N]   (N timed steps per preset; default 5, 3 for gpt2-124m)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/trainer.h"

namespace {

using loom::train::JobConfig;
using loom::train::Phase;
using loom::train::StepResult;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void Bench(const std::string& preset, int timed_steps, int warmup_steps) {
  JobConfig c;
  c.preset = preset;
  c.model = *loom::train::PresetDims(preset);
  c.data_builtin = "tiny-corpus";
  c.seq_len = 64;
  c.micro_batch = 4;
  c.global_batch_tokens = 4 * 64;
  c.steps = warmup_steps + timed_steps;
  loom::train::Dataset data =
      loom::train::Dataset::Load("", c.data_builtin, "", c.model.vocab, c.seq_len);
  loom::train::Trainer trainer(c, loom::train::ResolveBatchShape(c, loom::train::RankEnv{}), data);
  std::vector<double> tps, fwd, bwd, opt;
  StepResult last;
  for (int i = 0; i < warmup_steps + timed_steps; ++i) {
    last = trainer.Step();
    if (i < warmup_steps) continue;
    tps.push_back(last.times.tokens_per_second);
    fwd.push_back(last.times.phase(Phase::kForward));
    bwd.push_back(last.times.phase(Phase::kBackward));
    opt.push_back(last.times.phase(Phase::kOptimizer));
  }
  std::printf("%-10s %12zu %10.1f %10.1f %10.1f %10.1f %10.0f %8.0f\n", preset.c_str(),
              trainer.model().num_params(), Median(tps), Median(fwd) * 1e3, Median(bwd) * 1e3,
              Median(opt) * 1e3, last.peak_memory_bytes / 1048576.0, last.rss_bytes / 1048576.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 0;
  if (argc == 3 && std::string(argv[1]) == "--steps") steps = std::atoi(argv[2]);
  std::printf("B=4 T=64, median of the timed steps after warmup\n");
  std::printf("%-10s %12s %10s %10s %10s %10s %10s %8s\n", "preset", "params", "tokens/s", "fwd ms",
              "bwd ms", "optim ms", "peak MiB", "RSS MiB");
  Bench("tiny", steps > 0 ? steps : 20, 3);
  Bench("small", steps > 0 ? steps : 5, 2);
  Bench("gpt2-124m", steps > 0 ? steps : 3, 1);
  return 0;
}
