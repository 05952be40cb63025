// Data parallelism on the GPU path (the CUDA backend + CudaGradSync behind the step loop) in the
// CPU emulation, against the
// one-"GPU" run: two emulated ranks of dp = 2 must give the one-rank loss curve within bf16's
// tolerance, and the same loss and gradient norm on both ranks.
//
// Test role: ThreadNccl (thread_nccl.h, the layout matrix's stand-in) takes NCCL's place: the
// two ranks are host threads that take turns, and a collective completes when both entered it
// (bf16 sums rounded after each addition, as NCCL's ring rounds). Work completes at once; the
// communication stream is an emulated stream, but nothing overlaps. What this checks: the
// bucket offsets on the padded layout, packing and unpacking, the 1/(K·dp) loss scale, the
// sampler's dp rank, the loss average. What it cannot: stream ordering, timing, real NCCL.
//
// Usage: emu_dp_check [STEPS] [VOCAB]. Prints one line per step and PASS or FAIL.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/gpu/emu/thread_nccl.h"
#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/data/dataset.h"
#include "worker/train/trainer.h"

namespace loom::train {

namespace {

// The CUDA backend of one rank holding the whole model, over `group` (dp and world) or alone.
std::unique_ptr<CudaBackend> GpuBackend(const JobConfig& c, NcclCommunicator* group) {
  CudaBackendOptions o;
  o.adam.weight_decay = static_cast<float>(c.weight_decay);
  o.world = group;
  o.dp = group;
  o.bucket_bytes = 8 << 10;  // small, so that tiny's gradients need many, overlapped with backward
  return std::make_unique<CudaBackend>(c.model, ModelShard{1, 0, 0, c.model.layers}, c.seed, o);
}

}  // namespace
}  // namespace loom::train

int main(int argc, char** argv) {
  using namespace loom::train;
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  JobConfig c;
  c.preset = "tiny";
  c.model = *PresetDims("tiny");
  if (argc > 2) c.model.vocab = std::atoi(argv[2]);
  c.data_builtin = "tiny-corpus";
  c.steps = steps;
  c.seq_len = 32;
  c.micro_batch = 2;
  c.global_batch_tokens = 2 * 2 * 32;  // one rank: K = 2 micro-batches; dp = 2: one each
  c.lr = 3e-3;
  Dataset data = Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
  const BatchShape one = ResolveBatchShape(c, RankEnv{});

  std::vector<StepResult> single;
  {
    Trainer gpu(c, one, data, TrainerComms{}, TrainerOptions{}, GpuBackend(c, nullptr));
    for (int s = 0; s < steps; ++s) single.push_back(gpu.Step());
  }

  std::vector<std::vector<StepResult>> ranks(2);
  std::vector<size_t> buckets(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      loom::emu::TakeTurn();
      BatchShape shape = one;
      shape.K = 1;
      shape.dp_size = 2;
      shape.dp_rank = r;
      {
        // The world and the dp group (tp = pp = 1), the layout matrix's stand-in for NCCL.
        loom::emu::ThreadNccl group("dp-check", r, 2);
        TrainerOptions options;
        options.bucket_bytes = 8 << 10;
        Trainer t(c, shape, data, TrainerComms{&group, &group, nullptr, nullptr, nullptr}, options,
                  GpuBackend(c, &group));
        buckets[r] = t.num_buckets();
        for (int s = 0; s < steps; ++s) ranks[r].push_back(t.Step());
      }
      loom::emu::GiveTurn();
    });
  }
  for (std::thread& t : threads) t.join();

  int failures = 0;
  std::printf("dp = 2, vocab %d, %zu buckets per rank\n", c.model.vocab, buckets[0]);
  for (int s = 0; s < steps; ++s) {
    const StepResult& a = ranks[0][s];
    const StepResult& b = ranks[1][s];
    const double rel_loss = std::fabs(a.loss - single[s].loss) / single[s].loss;
    const double rel_norm = std::fabs(a.grad_norm - single[s].grad_norm) / single[s].grad_norm;
    const bool same = a.loss == b.loss && a.grad_norm == b.grad_norm;
    const bool ok = same && std::isfinite(a.loss) && rel_loss <= 0.02 && rel_norm <= 0.05 &&
                    a.comm.dp_all_reduce > 0;
    failures += !ok;
    std::printf(
        "%s  step %d: loss %.6f (ranks %s) vs one rank %.6f, rel %.1e; norm %.6f vs %.6f, "
        "rel %.1e; %zu bytes all-reduced\n",
        ok ? "PASS" : "FAIL", s + 1, a.loss, same ? "equal" : "DIFFER", single[s].loss, rel_loss,
        a.grad_norm, single[s].grad_norm, rel_norm, a.comm.dp_all_reduce);
  }
  std::printf("%s: data parallel on the emulated GPU path, %d failure(s)\n",
              failures ? "FAIL" : "OK", failures);
  return failures ? 1 : 0;
}
