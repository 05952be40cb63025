// block_cost_bench: what the per-block timing (issue 12, part 1) costs the step. Two trainers of
// the same model and batch step in alternation (so machine drift hits both alike): one times
// every block on every step (the worst case, kBlockSampleEvery = 1), the other never. Prints
// the median step seconds of each over the timed steps and the median of the per-pair ratios;
// loom-train samples one step in kBlockSampleEvery, so its overhead is that figure divided by
// kBlockSampleEvery. Not a test: run by hand, record in docs/benchmarks.md.
//   block_cost_bench [--steps N] [--preset NAME]   (N timed steps per preset and trainer, default
//   20; presets tiny and small by default)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/profiler/block_costs.h"
#include "worker/train/trainer.h"

namespace {

using loom::train::JobConfig;
using loom::train::Trainer;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void Bench(const std::string& preset, int timed_steps) {
  constexpr int kWarmup = 2;
  JobConfig c;
  c.preset = preset;
  c.model = *loom::train::PresetDims(preset);
  c.data_builtin = "tiny-corpus";
  c.seq_len = 64;
  c.micro_batch = 4;
  c.global_batch_tokens = 4 * 64;
  c.steps = kWarmup + timed_steps;
  loom::train::Dataset data =
      loom::train::Dataset::Load("", c.data_builtin, "", c.model.vocab, c.seq_len);
  const auto shape = loom::train::ResolveBatchShape(c, loom::train::RankEnv{});
  Trainer on(c, shape, data), off(c, shape, data);
  on.set_block_sample_every(1);
  off.set_block_sample_every(0);
  std::vector<double> t_on, t_off, pair_ratio;
  for (int i = 0; i < kWarmup + timed_steps; ++i) {
    // Alternate which goes first so that neither always follows the other's cache state.
    const bool on_first = i % 2 == 0;
    const double a = (on_first ? on : off).Step().times.step_seconds;
    const double b = (on_first ? off : on).Step().times.step_seconds;
    if (i < kWarmup) continue;
    t_on.push_back(on_first ? a : b);
    t_off.push_back(on_first ? b : a);
    pair_ratio.push_back(t_on.back() / t_off.back());
  }
  const double m_on = Median(t_on), m_off = Median(t_off);
  // The median of each pair's ratio: drift between pairs (other load on the machine) cancels.
  const double ratio = Median(pair_ratio);
  std::printf("%-10s %6d %14.3f %14.3f %10.4f %18.3f\n", preset.c_str(), c.model.layers,
              m_off * 1e3, m_on * 1e3, ratio,
              (ratio - 1.0) * 100.0 / static_cast<double>(loom::train::kBlockSampleEvery));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  std::vector<std::string> presets = {"tiny", "small"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--preset") == 0 && i + 1 < argc) {
      presets = {argv[++i]};
    } else {
      std::fprintf(stderr, "usage: block_cost_bench [--steps N] [--preset NAME]\n");
      return 2;
    }
  }
  std::printf("%-10s %6s %14s %14s %10s %18s\n", "preset", "L", "off ms/step", "every ms/step",
              "pair ratio", "overhead % (1/N)");
  for (const std::string& preset : presets) Bench(preset, steps);
  return 0;
}
