#include "server/planner/layout_evaluator.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "server/planner/cpu_backend_memory.h"
#include "server/planner/cuda_backend_memory.h"
#include "server/planner/stage_partitioner.h"

namespace loom::planner {
namespace {

// The divisor of n nearest to v from below and above (0 when none below).
std::pair<int, int> NearestDivisors(int n, int v) {
  int below = 0, above = 0;
  for (int k = std::min(v, n); k >= 1; --k) {
    if (n % k == 0) {
      below = k;
      break;
    }
  }
  for (int k = std::max(v, 1); k <= n; ++k) {
    if (n % k == 0) {
      above = k;
      break;
    }
  }
  return {below, above};
}

std::string Alternatives(std::pair<int, int> p) {
  if (p.first > 0 && p.second > 0 && p.first != p.second) {
    return absl::StrCat(p.first, " or ", p.second);
  }
  return absl::StrCat(p.first > 0 ? p.first : p.second);
}

// The predicted step and the throughput figures of `ev`'s layout and stage split.
void FillTime(const ModelShape& m, Precision precision, const DeviceSpec& d, Evaluation& ev) {
  const Layout& l = ev.layout;
  ev.time = EstimateStep(m, precision, l, d, ev.blocks_per_stage);
  const double tokens = double(l.dp) * l.micro_batch * l.num_micro_batches * m.seq_len;
  ev.tokens_per_second = tokens / ev.time.total;
  ev.model_flops_per_device = ModelFlopsPerToken(m) * ev.tokens_per_second / l.world();
  const double peak_flops =
      precision == Precision::kFp32 ? d.peak_flops * d.efficiency.fp32_peak_ratio : d.peak_flops;
  ev.mfu = ev.model_flops_per_device / peak_flops;
}

}  // namespace

absl::Status ValidateLayout(const ModelShape& m, const DeviceSpec& d, const Layout& l,
                            int64_t global_batch_sequences) {
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.micro_batch < 1 || l.num_micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism sizes must be >= 1, got ", LayoutString(l)));
  }
  if (m.heads % l.tp != 0 || (4 * m.hidden) % l.tp != 0) {
    const int g = std::gcd(m.heads, 4 * m.hidden);
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.tensor ", l.tp, " does not divide model.heads ", m.heads,
                     " and the MLP width ", 4 * m.hidden, ": use tensor ",
                     Alternatives(NearestDivisors(g, l.tp))));
  }
  if (l.pp > m.layers) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.pipeline ", l.pp,
                                                   " exceeds model.layers ", m.layers,
                                                   ": use pipeline <= ", m.layers));
  }
  if (l.world() != d.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism: data ", l.dp, " × tensor ", l.tp, " × pipeline ", l.pp, " = ", l.world(),
        " but ", d.count, " devices are given",
        d.count % (l.tp * l.pp) == 0 ? absl::StrCat(": use data ", d.count / (l.tp * l.pp)) : ""));
  }
  const int64_t per_step = int64_t{l.dp} * l.micro_batch * l.num_micro_batches;
  if (per_step != global_batch_sequences) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data ", l.dp, " × micro_batch ", l.micro_batch, " × micro_batches ", l.num_micro_batches,
        " = ", per_step, " sequences, but the global batch is ", global_batch_sequences));
  }
  return absl::OkStatus();
}

Evaluation EvaluateLayout(const ModelShape& m, Precision precision, const DeviceSpec& d,
                          const Layout& l) {
  Evaluation ev;
  ev.layout = l;

  // The layouts Loom's own backends run get those backends' exact buffer layouts: CPU devices
  // the CPU backend's (cpu_backend_memory.h), GPUs GptCuda's (cuda_backend_memory.h), which
  // is what the worker reports as its peak (the published formula overestimates it ~1.8x, as
  // it counts a Megatron block's dropout masks, pre-softmax scores and a 10% margin). Layouts
  // they refuse (recompute, tp or pp > 1 on the CPU's, the other precision) are
  // Megatron-style layouts Loom does not run yet: they keep the published formula below. A GPU
  // pipeline gets the GPU backend's buffers per stage of the partition.
  const bool gpu = d.model != "cpu";
  absl::StatusOr<MemoryBreakdown> backend =
      !gpu ? CpuBackendMemory(m, precision, l)
      : l.pp == 1
          ? CudaBackendMemory(m, precision, l)
          : absl::StatusOr<MemoryBreakdown>(absl::UnimplementedError("pipeline: per stage"));
  if (backend.ok()) {
    ev.blocks_per_stage = {m.layers};  // one stage: neither backend has a pipeline
    ev.stage_memory = {*backend};
    ev.peak_stage = 0;
    ev.peak_memory = *backend;
    ev.headroom_bytes = d.memory_bytes - backend->total();
    ev.fits = ev.headroom_bytes >= 0;
    FillTime(m, precision, d, ev);
    return ev;
  }

  // The partition problem: uniform blocks (every GPT block has the same shape), extras on the
  // first and last stage, memory per stage from the memory model.
  const BlockTime block = BlockCost(m, precision, l, d);
  PartitionProblem problem;
  problem.num_stages = l.pp;
  problem.block_cost.assign(m.layers, block.total());
  problem.first_stage_cost = FirstStageExtra(m, precision, l, d).total();
  problem.last_stage_cost = LastStageExtra(m, precision, l, d).total();
  problem.block_static_bytes.assign(m.layers,
                                    BlockParams(m, l.tp) * ParamBytes(precision, l).total());
  problem.block_activation_bytes.assign(m.layers, BlockActivationBytes(m, precision, l));
  for (int i = 0; i < l.pp; ++i) {
    problem.stage_fixed_bytes.push_back(StageFixedBytes(m, precision, l, i));
    problem.stage_in_flight.push_back(MicroBatchesInFlight(l, i));
  }
  problem.capacity_bytes = AllocatableBytes(d);

  absl::StatusOr<Partition> part = PartitionStages(problem);
  ev.fits = part.ok();
  if (!part.ok()) part = MinimizePeakMemory(problem);
  ev.blocks_per_stage = part->blocks_per_stage;

  // A pipeline the GPU backend runs gets its exact per-stage buffers for the partition's
  // stages (the partition itself stays the formula's, which is the more cautious).
  bool exact = gpu;
  double peak = -1;
  for (int i = 0; i < l.pp; ++i) {
    absl::StatusOr<MemoryBreakdown> stage =
        gpu ? CudaBackendMemory(m, precision, l, i, ev.blocks_per_stage[i])
            : absl::StatusOr<MemoryBreakdown>(absl::UnimplementedError("the formula"));
    exact = exact && stage.ok();
    ev.stage_memory.push_back(
        stage.ok() ? *stage : StageMemory(m, precision, l, d, i, ev.blocks_per_stage[i]));
    if (ev.stage_memory.back().total() > peak) {
      peak = ev.stage_memory.back().total();
      ev.peak_stage = i;
    }
  }
  ev.peak_memory = ev.stage_memory[ev.peak_stage];
  ev.headroom_bytes = d.memory_bytes - peak;
  if (exact) ev.fits = ev.headroom_bytes >= 0;

  FillTime(m, precision, d, ev);
  return ev;
}

}  // namespace loom::planner
