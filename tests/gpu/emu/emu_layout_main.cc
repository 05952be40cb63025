// The layout invariance matrix of issue 14 on emulated GPU ranks: the CUDA backend (GptCuda in
// bf16 with fp32 masters) behind the one step loop (Trainer), under data, tensor and pipeline
// parallelism and ZeRO-1, against the CPU trainer (fp32, one rank) on the same seed, data and
// global batch (DESIGN.md, "The invariance principle"; bf16 against fp32 within a few percent).
//
// Every rank of a layout is a host thread of this process with its own CudaBackend on the one
// emulated device; ThreadNccl (thread_nccl.h, a test role) stands in for NCCL, one group
// instance per GroupSpec of parallel/process_groups.h, as MakeCudaRankBackend connects them.
//
// Checks, each a PASS/FAIL line:
//   a. per layout: every step's loss within kLossTol of the CPU run's, and the same on every
//      rank (the trainer shares it); the gradient norm within kNormTol;
//   b. a checkpoint written at step 1 by the GPU ranks of the last layout resumes under other
//      GPU layouts and on the CPU, and each continues the CPU run's curve.
//
// Usage: emu_layout_check [steps] [quick]   (default 3 steps; "quick": the short matrix of
// scripts/test.sh, two layouts). Prints the table and exits non-zero on any failure.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/emu/thread_nccl.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/data/dataset.h"
#include "worker/train/parallel/process_groups.h"
#include "worker/train/trainer.h"

namespace {

using namespace loom::train;

constexpr double kLossTol = 0.03;  // bf16 against fp32, a few steps
constexpr double kNormTol = 0.10;
constexpr int kSequences = 4;  // per step, micro-batches of 1 sequence
constexpr int kSeqLen = 32;

int failures = 0;

void Report(bool pass, const std::string& what) {
  std::printf("%s  %s\n", pass ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  failures += !pass;
}

double Rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

struct LayoutCase {
  int dp = 1, tp = 1, pp = 1;
  std::string schedule = "1f1b";
  bool zero1 = false;
  int world() const { return dp * tp * pp; }
  std::string Name() const {
    return "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" + std::to_string(pp) +
           " " + schedule + (zero1 ? " zero1" : "");
  }
};

JobConfig Config(int steps) {
  JobConfig c;
  c.model = *PresetDims("tiny");  // L=2, C=64, NH=4, maxT=64, V=256
  c.data_builtin = "tiny-corpus";
  c.steps = steps;
  c.seq_len = kSeqLen;
  c.micro_batch = 1;
  c.global_batch_tokens = int64_t{kSequences} * kSeqLen;
  c.lr = 3e-3;
  c.warmup_steps = 1;
  c.precision = "bf16";
  return c;
}

BatchShape ShapeOf(const JobConfig& c, const LayoutCase& l, int rank) {
  RankEnv env;
  env.rank = rank;
  env.world_size = l.world();
  env.has_layout = true;
  env.layout.data = l.dp;
  env.layout.tensor = l.tp;
  env.layout.pipeline = l.pp;
  env.layout.micro_batch = 1;
  env.layout.num_micro_batches = kSequences / l.dp;
  env.layout.schedule = l.schedule;
  env.layout.zero1 = l.zero1;
  return ResolveBatchShape(c, env);
}

// One emulated GPU rank: its groups (ThreadNccl, named after the run) and its trainer.
struct Rank {
  ProcessGroups groups;
  std::unique_ptr<Trainer> trainer;
};

std::unique_ptr<Rank> MakeRank(const JobConfig& c, const Dataset& data, const LayoutCase& l,
                               int rank, const std::string& run) {
  auto r = std::make_unique<Rank>();
  const BatchShape shape = ShapeOf(c, l, rank);
  r->groups = ProcessGroups::Alone();
  if (l.world() > 1) {
    for (const GroupSpec& spec : GroupsOf(shape, rank)) {
      std::unique_ptr<Communicator> comm;
      if (spec.size == 1) {
        comm = std::make_unique<SingleRankCommunicator>();
      } else {
        comm = std::make_unique<loom::emu::ThreadNccl>(run + "/" + spec.name, spec.rank, spec.size);
      }
      if (spec.name.rfind("pp.", 0) == 0 && spec.size > 1) {
        // As MakeCudaRankBackend: the gradients on a pipeline communicator of their own.
        r->groups.pp_grad = std::make_unique<loom::emu::ThreadNccl>(run + "/" + spec.name + ".grad",
                                                                    spec.rank, spec.size);
      }
      const std::string& n = spec.name;
      std::unique_ptr<Communicator>* slot = n == "world"             ? &r->groups.world
                                            : n.rfind("tp.", 0) == 0 ? &r->groups.tp
                                            : n.rfind("dp.", 0) == 0 ? &r->groups.dp
                                            : n.rfind("pp.", 0) == 0 ? &r->groups.pp
                                                                     : &r->groups.emb;
      *slot = std::move(comm);
    }
  }
  const ProcessGroups& g = r->groups;
  auto nccl = [](const std::unique_ptr<Communicator>& p) {
    return dynamic_cast<NcclCommunicator*>(p.get());
  };
  CudaBackendOptions o;
  o.adam.weight_decay = static_cast<float>(c.weight_decay);
  o.world = nccl(g.world);
  o.dp = nccl(g.dp);
  o.tp = nccl(g.tp);
  o.pp = nccl(g.pp);
  o.emb = nccl(g.emb);
  o.pp_grad = nccl(g.pp_grad);
  o.bucket_bytes = 16 << 10;  // several buckets even for tiny
  o.zero1 = shape.zero1 && shape.dp_size > 1;
  o.zero_piece = 4096;  // ZeRO-1's collectives in several pieces even for tiny
  const ModelShard shard{shape.tp_size, shape.tp_rank, shape.first_block(), shape.last_block()};
  auto backend = std::make_unique<CudaBackend>(c.model, shard, c.seed, o);
  TrainerOptions options;
  options.bucket_bytes = o.bucket_bytes;
  r->trainer = std::make_unique<Trainer>(
      c, shape, data,
      TrainerComms{g.world.get(), g.dp.get(), g.tp.get(), g.pp.get(), g.emb.get(), g.pp_grad.get()},
      options, std::move(backend));
  return r;
}

// Runs `body(rank, trainer)` on every rank of `l` as threads taking turns; returns rank 0's
// results and checks that every rank saw the same loss.
std::vector<StepResult> RunLayout(const JobConfig& c, const Dataset& data, const LayoutCase& l,
                                  const std::string& run,
                                  const std::function<void(int, Trainer&)>& before,
                                  int64_t until_step, const std::string& save_dir = "",
                                  int64_t save_at = -1) {
  std::vector<std::vector<StepResult>> results(l.world());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < l.world(); ++rank) {
    threads.emplace_back([&, rank] {
      loom::emu::TakeTurn();
      {
        std::unique_ptr<Rank> r = MakeRank(c, data, l, rank, run);
        if (before) before(rank, *r->trainer);
        while (r->trainer->step() < until_step) {
          results[rank].push_back(r->trainer->Step());
          if (r->trainer->step() == save_at) r->trainer->Save(save_dir, /*generation=*/1);
        }
      }
      loom::emu::GiveTurn();
    });
  }
  for (std::thread& t : threads) t.join();
  bool same = true;
  for (int rank = 1; rank < l.world(); ++rank) {
    for (size_t s = 0; s < results[0].size(); ++s) {
      same = same && results[rank].size() == results[0].size() &&
             results[rank][s].loss == results[0][s].loss;
    }
  }
  Report(same, l.Name() + ": every rank reports the same losses");
  return results[0];
}

// Compares steps [first, ...) of `got` (rank 0 of a GPU layout) with the CPU run.
void Compare(const std::string& what, const std::vector<StepResult>& got,
             const std::vector<StepResult>& cpu) {
  bool ok = !got.empty();
  double worst_loss = 0.0, worst_norm = 0.0;
  for (const StepResult& r : got) {
    const StepResult& ref = cpu[static_cast<size_t>(r.step - 1)];
    const double el = Rel(r.loss, ref.loss), en = Rel(r.grad_norm, ref.grad_norm);
    std::printf("    step %lld  loss %.6f (cpu %.6f, rel %.2e)  |g| %.5f (cpu %.5f, rel %.2e)\n",
                static_cast<long long>(r.step), r.loss, ref.loss, el, r.grad_norm, ref.grad_norm,
                en);
    ok = ok && std::isfinite(r.loss) && el <= kLossTol && en <= kNormTol;
    worst_loss = std::max(worst_loss, el);
    worst_norm = std::max(worst_norm, en);
  }
  char line[200];
  std::snprintf(line, sizeof line,
                "%s: %zu steps follow the CPU curve (worst loss rel %.2e <= %.0e, norm %.2e <= "
                "%.0e)",
                what.c_str(), got.size(), worst_loss, kLossTol, worst_norm, kNormTol);
  Report(ok, line);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive an abort in the emulation
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  const bool quick = argc > 2 && std::strcmp(argv[2], "quick") == 0;
  if (steps < 2) {
    std::fprintf(stderr, "usage: emu_layout_check [steps >= 2] [quick]\n");
    return 2;
  }
  const JobConfig c = Config(steps);
  const Dataset data = Dataset::Load("", c.data_builtin, "", c.model.vocab, c.seq_len);

  // The reference: the CPU trainer, one rank, K = kSequences micro-batches.
  std::vector<StepResult> cpu;
  {
    Trainer t(c, ShapeOf(c, LayoutCase{}, 0), data, TrainerComms{}, TrainerOptions{});
    for (int s = 0; s < steps; ++s) cpu.push_back(t.Step());
  }
  std::printf("== the CPU reference: tiny, %d sequences of %d tokens per step, %d steps\n",
              kSequences, kSeqLen, steps);

  // The last layout writes the checkpoint below (ZeRO-1: its masters and moments gathered).
  std::vector<LayoutCase> matrix = {
      {1, 2, 1, "1f1b"},  {1, 1, 2, "1f1b"},       {1, 1, 2, "gpipe"},     {2, 2, 2, "1f1b"},
      {2, 1, 2, "gpipe"}, {2, 2, 1, "1f1b", true}, {2, 1, 2, "1f1b", true}};
  if (quick) matrix = {{1, 2, 1, "1f1b"}, {2, 1, 2, "1f1b", true}};
  int run = 0;
  for (const LayoutCase& l : matrix) {
    std::printf("== %s (%d emulated GPU ranks)\n", l.Name().c_str(), l.world());
    const std::vector<StepResult> got =
        RunLayout(c, data, l, "run" + std::to_string(run++), nullptr, steps);
    Compare(l.Name(), got, cpu);
  }

  // b. A checkpoint across layouts and devices: written at step 1 by the GPU ranks of the last
  // layout of the matrix, resumed by another GPU layout and by the CPU trainer.
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("loom-emu-layout-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  const LayoutCase writer = matrix.back();
  std::printf("== checkpoint: written under %s at step 1\n", writer.Name().c_str());
  RunLayout(c, data, writer, "run" + std::to_string(run++), nullptr, 1, dir, 1);
  const std::string saved = dir + "/step-000001";
  Report(std::filesystem::exists(saved + "/manifest.json"), "the checkpoint is committed");
  // Resumed under the first layout, and (unless quick) under ZeRO-1 with another dp split.
  std::vector<LayoutCase> readers = {matrix.front()};
  if (!quick) readers.push_back({2, 2, 1, "1f1b", true});
  for (const LayoutCase& reader : readers) {
    std::printf("== resumed under %s\n", reader.Name().c_str());
    const std::vector<StepResult> resumed = RunLayout(
        c, data, reader, "run" + std::to_string(run++), [&](int, Trainer& t) { t.Resume(saved); },
        steps);
    Compare("resumed under " + reader.Name(), resumed, cpu);
  }
  std::printf("== resumed on the CPU\n");
  {
    Trainer t(c, ShapeOf(c, LayoutCase{}, 0), data, TrainerComms{}, TrainerOptions{});
    t.Resume(saved);
    std::vector<StepResult> on_cpu;
    while (t.step() < steps) on_cpu.push_back(t.Step());
    Compare("the GPU checkpoint resumed on the CPU", on_cpu, cpu);
  }
  std::filesystem::remove_all(dir);
  std::printf("%s: %d failure(s)\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
