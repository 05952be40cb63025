// parallel_bench: what the parallel runtime costs and hides, measured by loom-train itself
// (each rank its own process, meeting through a temp rendezvous directory; figures from the
// progress lines' profiler fields, docs/rank-contract.md). Not a test: run by hand, record in
// docs/benchmarks.md.
//   1. `small`, dp = 2: step time with the gradient buckets overlapping backward
//      (--dp-overlap true) and without (false), and the measured overlap ratio.
//   2. pp = 2 and 4, 1F1B and GPipe, m = 2, 4, 8 micro-batches: the measured bubble ratio (mean
//      over the stages of bubble / step time) beside the ideal (p-1)/(m+p-1), for a model with
//      balanced stages and for `small` (whose head makes the last stage the slowest).
// Each figure is the median over the timed steps (after 2 warm-up steps).
//   parallel_bench [--steps N] [--seq-len T] [--dp-only | --pp-only]   (defaults 6 and 64)
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "worker/train/config/json.h"
#include "worker/train/parallel/pipeline_schedule.h"

namespace {

using loom::train::ParseJson;
using loom::train::Value;

constexpr int kWarmup = 2;

double Number(const Value& v, const char* key) {
  const Value* f = v.Find(key);
  return f ? std::strtod(f->text.c_str(), nullptr) : 0.0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct StepFigures {
  double step_seconds = 0, comm_exposed = 0, bubble = 0, overlap_ratio = 0, bubble_ratio = 0;
  double dp_comm_seconds = 0;
};

// Runs `world` ranks of loom-train with LOOM_LAYOUT `layout` and `args`; returns each rank's
// timed steps. Exits on a failed rank.
std::vector<std::vector<StepFigures>> RunRanks(const std::string& dir, int world,
                                               const std::string& layout,
                                               const std::vector<std::string>& args) {
  static int run = 0;
  const std::string tag = dir + "/run" + std::to_string(run++);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("LOOM_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOOM_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOOM_LAYOUT", layout.c_str(), 1);
      ::setenv("LOOM_RENDEZVOUS_DIR", (tag + "-rv").c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
      ::setenv("OMP_WAIT_POLICY", "passive", 1);
      int out = ::open((tag + "-" + std::to_string(r) + ".json").c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open((tag + "-" + std::to_string(r) + ".err").c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<std::string> all = {LOOM_TRAIN_BIN};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(LOOM_TRAIN_BIN, argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<std::vector<StepFigures>> ranks(world);
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::ifstream err(tag + "-" + std::to_string(r) + ".err");
      std::fprintf(stderr, "rank %d of %s failed:\n%s\n", r, layout.c_str(),
                   std::string(std::istreambuf_iterator<char>(err), {}).c_str());
      std::exit(1);
    }
    std::ifstream in(tag + "-" + std::to_string(r) + ".json");
    std::string line;
    while (std::getline(in, line)) {
      Value v = ParseJson(line, "progress line");
      if (!v.Find("event") || v.Find("event")->text != "step") continue;
      if (Number(v, "step") <= kWarmup) continue;
      StepFigures f;
      f.step_seconds = Number(v, "step_seconds");
      if (const Value* p = v.Find("phases")) {
        f.comm_exposed = Number(*p, "comm_exposed");
        f.bubble = Number(*p, "bubble");
      }
      f.overlap_ratio = Number(v, "overlap_ratio");
      f.bubble_ratio = Number(v, "bubble_ratio");
      f.dp_comm_seconds = Number(v, "dp_comm_seconds");
      ranks[r].push_back(f);
    }
  }
  return ranks;
}

template <typename F>
double MedianOf(const std::vector<StepFigures>& steps, F field) {
  std::vector<double> v;
  for (const StepFigures& s : steps) v.push_back(field(s));
  return Median(v);
}

// The model flags of the two models: `small` itself, whose head (V = 50257) costs about as
// much as 11 of its blocks, so its last stage is always the slowest; and a balanced variant,
// small's blocks (C = 384, NH = 6) with 8 layers and a byte vocabulary (V = 256), whose stages
// cost the same, the case the ideal formula describes.
const std::vector<std::string> kSmall = {"--preset", "small"};
const std::vector<std::string> kBalanced = {
    "--layers", "8", "--hidden", "384", "--heads", "6", "--model-seq-len", "256", "--vocab", "256"};

std::vector<std::string> ModelArgs(const std::vector<std::string>& model, int steps, int seq_len,
                                   int sequences) {
  std::vector<std::string> args = model;
  args.insert(args.end(), {"--data-builtin", "tiny-corpus", "--steps", std::to_string(steps),
                           "--seq-len", std::to_string(seq_len), "--global-batch-tokens",
                           std::to_string(sequences * seq_len), "--batch", "1", "--quiet"});
  return args;
}

void PipelineTable(const std::string& dir, const char* name, const std::vector<std::string>& model,
                   int steps, int seq_len) {
  std::printf("\n## %s, pipeline bubble (micro-batch 1, T = %d), %d timed steps\n\n", name, seq_len,
              steps - kWarmup);
  std::printf("| p | m | schedule | step s | bubble ratio per stage | mean | (p-1)/(m+p-1) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int p : {2, 4}) {
    for (int m : {2, 4, 8}) {
      for (const char* schedule : {"1f1b", "gpipe"}) {
        const std::string layout = "data=1,tensor=1,pipeline=" + std::to_string(p) +
                                   ",micro_batch=1,num_micro_batches=" + std::to_string(m) +
                                   ",schedule=" + schedule;
        auto ranks = RunRanks(dir, p, layout, ModelArgs(model, steps, seq_len, m));
        std::string per_stage;
        double sum = 0, step = 0;
        for (int s = 0; s < p; ++s) {
          const double b = MedianOf(ranks[s], [](const StepFigures& f) { return f.bubble_ratio; });
          sum += b;
          step = std::max(step,
                          MedianOf(ranks[s], [](const StepFigures& f) { return f.step_seconds; }));
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%s%.2f", s ? " / " : "", b);
          per_stage += buf;
        }
        std::printf("| %d | %d | %s | %.3f | %s | %.2f | %.2f |\n", p, m, schedule, step,
                    per_stage.c_str(), sum / p, loom::train::IdealBubbleRatio(p, m));
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int timed = 6, seq_len = 64;
  bool dp_only = false, pp_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dp-only") dp_only = true;
    if (a == "--pp-only") pp_only = true;
    if (i + 1 >= argc) continue;
    if (a == "--steps") timed = std::atoi(argv[i + 1]);
    if (a == "--seq-len") seq_len = std::atoi(argv[i + 1]);
  }
  const int steps = kWarmup + timed;
  std::string dir = (std::filesystem::temp_directory_path() / "loom-parallel-bench-XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) return 1;

  if (!pp_only) {
    std::printf("## small, dp = 2 (micro-batch 1 x 4 per rank, T = %d), %d timed steps\n\n",
                seq_len, timed);
    std::printf("| overlap | step s (median) | comm_exposed s | dp comm s | overlap ratio |\n");
    std::printf("| --- | --- | --- | --- | --- |\n");
    for (const char* overlap : {"true", "false"}) {
      std::vector<std::string> args = ModelArgs(kSmall, steps, seq_len, 8);
      args.insert(args.end(), {"--dp-overlap", overlap});
      auto ranks =
          RunRanks(dir, 2, "data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=4", args);
      std::vector<StepFigures> all;
      for (auto& r : ranks) all.insert(all.end(), r.begin(), r.end());
      std::printf("| %s | %.3f | %.4f | %.4f | %.2f |\n", overlap,
                  MedianOf(all, [](const StepFigures& s) { return s.step_seconds; }),
                  MedianOf(all, [](const StepFigures& s) { return s.comm_exposed; }),
                  MedianOf(all, [](const StepFigures& s) { return s.dp_comm_seconds; }),
                  MedianOf(all, [](const StepFigures& s) { return s.overlap_ratio; }));
      std::fflush(stdout);
    }
  }
  if (!dp_only) {
    PipelineTable(dir, "balanced (small blocks, 8 layers, V = 256)", kBalanced, steps, seq_len);
    PipelineTable(dir, "small", kSmall, steps, seq_len);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
