// trace_bench: what the per-rank timeline (worker/train/profiler/trace_ring.h) costs the step.
// Two trainers of the same model and batch step in alternation (so machine drift hits both
// alike): one records every phase into a trace ring on every step, as loom-train does under
// loom-worker, the other records nothing. Prints the median step seconds of each, the median of
// the per-pair ratios (the overhead), the records per step, the cost of one record alone (a
// million appends to a ring) and the overhead it implies (records x cost / step), which the
// medians confirm within their noise. Not a test: run by hand, record in docs/benchmarks.md.
//   trace_bench [--steps N] [--preset NAME]   (N timed steps per preset and trainer, default 30;
//   presets tiny and small by default)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/profiler/trace_recorder.h"
#include "worker/train/trainer.h"

namespace {

using loom::train::JobConfig;
using loom::train::TraceKind;
using loom::train::TraceRecorder;
using loom::train::Trainer;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string RingPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("loom-trace-bench-" + std::to_string(::getpid()) + "-" + name + ".ring"))
      .string();
}

void Bench(const std::string& preset, int timed_steps, double ns_per_record) {
  constexpr int kWarmup = 2;
  JobConfig c;
  c.preset = preset;
  c.model = *loom::train::PresetDims(preset);
  c.data_builtin = "tiny-corpus";
  c.seq_len = 64;
  c.micro_batch = 1;
  c.global_batch_tokens = 4 * 64;  // 4 micro-batches per step: 4 data, forward, backward records
  c.steps = kWarmup + timed_steps;
  loom::train::Dataset data =
      loom::train::Dataset::Load("", c.data_builtin, "", c.model.vocab, c.seq_len);
  const auto shape = loom::train::ResolveBatchShape(c, loom::train::RankEnv{});
  const std::string path = RingPath(preset);
  std::unique_ptr<TraceRecorder> trace = TraceRecorder::Open(path, 0, 1);
  if (!trace) std::exit(1);
  loom::train::TrainerOptions with;
  with.trace = trace.get();
  Trainer on(c, shape, data, loom::train::TrainerComms{}, with);
  Trainer off(c, shape, data, loom::train::TrainerComms{}, {});
  // Block sampling stays at its default in both: only the timeline differs.
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
  const double records_per_step =
      static_cast<double>(trace->ring().written()) / (kWarmup + timed_steps);
  const double ratio = Median(pair_ratio);
  // The same from the record's own cost: what the medians measure, without their noise.
  const double computed = records_per_step * ns_per_record * 1e-9 / Median(t_off) * 100.0;
  std::printf("%-10s %6d %14.3f %14.3f %10.4f %12.3f %12.1f %12.4f\n", preset.c_str(),
              c.model.layers, Median(t_off) * 1e3, Median(t_on) * 1e3, ratio, (ratio - 1.0) * 100.0,
              records_per_step, computed);
  std::fflush(stdout);
  trace.reset();
  std::filesystem::remove(path);
}

// Nanoseconds per record: two clock reads and one append, a million times.
double NanosPerRecord() {
  const std::string path = RingPath("append");
  std::unique_ptr<TraceRecorder> trace = TraceRecorder::Open(path, 0, 1);
  if (!trace) std::exit(1);
  trace->BeginStep(1);
  constexpr int kN = 1'000'000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) {
    const int64_t t = TraceRecorder::Now();
    trace->Since(TraceKind::kForward, t, i & 7, 0, 0);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trace.reset();
  std::filesystem::remove(path);
  return s * 1e9 / kN;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  std::vector<std::string> presets = {"tiny", "small"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--preset") == 0 && i + 1 < argc) {
      presets = {argv[++i]};
    } else {
      std::fprintf(stderr, "usage: trace_bench [--steps N] [--preset NAME]\n");
      return 2;
    }
  }
  const double ns = NanosPerRecord();
  std::printf("one record (two clock reads + append): %.1f ns\n", ns);
  std::printf("%-10s %6s %14s %14s %10s %12s %12s %12s\n", "preset", "L", "off ms/step",
              "traced ms/step", "pair ratio", "overhead %", "records/step", "computed %");
  for (const std::string& preset : presets) Bench(preset, steps, ns);
  return 0;
}
