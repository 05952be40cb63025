// The GPU training path (GptCuda and the CUDA backend behind the one step loop, the caching
// allocator over the CUDA runtime) in the CPU emulation, against the CPU trainer on the same job
// (tests/gpu/emu/README.md): the `tiny` preset on the built-in corpus, one rank, K micro-batches of
// gradient accumulation. Prints one PASS/FAIL line per check and exits non-zero on any failure, or
// when a cuBLAS call would have been rejected by the real library.
//
// Usage: emu_train_check [steps]   (default 8)
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/data/dataset.h"
#include "worker/train/model/dims.h"
#include "worker/train/profiler/block_costs.h"
#include "worker/train/profiler/trace_recorder.h"
#include "worker/train/profiler/trace_ring.h"
#include "worker/train/trainer.h"

namespace loom::emu {
int ShapeErrors();
uint64_t DeviceAllocCount();
}  // namespace loom::emu

namespace {

using loom::train::AllocatorStats;
using loom::train::BatchShape;
using loom::train::CudaBackend;
using loom::train::Dataset;
using loom::train::JobConfig;
using loom::train::StepResult;
using loom::train::TensorInfo;
using loom::train::Trainer;

// bf16 against fp32: the loss of one step, the gradient norm, the evaluation loss.
constexpr double kLossTol = 0.05;
constexpr double kGradNormTol = 0.05;
constexpr double kEvalTol = 0.05;
// Initial parameters: the fp32 masters are uploaded as they are; 1e-2 is bf16's rounding.
constexpr double kParamTol = 1e-2;
// The first AdamW update of each tensor (about lr * sign(gradient) per element): a tensor whose
// gradient is wrong, missing or misplaced moves differently from the CPU's.
constexpr double kUpdateTol = 0.25;

int failures = 0;

void Report(bool pass, const std::string& what) {
  std::printf("%s  %s\n", pass ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  failures += !pass;
}

double RelDiff(double a, double ref) {
  return std::fabs(a - ref) / std::max(std::fabs(ref), 1e-30);
}

// ||a - b|| / ||b|| over n elements; infinite when anything is not finite.
double RelNorm(const float* a, const float* b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
}

// Per tensor of `table`: ||gpu - cpu|| / ||cpu||; passes when all are within tol.
bool CompareTensors(const std::vector<TensorInfo>& table, const std::vector<float>& gpu,
                    const float* cpu, double tol, const char* label) {
  bool ok = true;
  std::printf("  %s, per tensor ||gpu - cpu|| / ||cpu||:\n", label);
  for (const TensorInfo& t : table) {
    const double e = RelNorm(gpu.data() + t.offset, cpu + t.offset, t.numel);
    std::printf("    %-9s %9zu  %10.3e%s\n", t.name.c_str(), t.numel, e, e <= tol ? "" : "  <--");
    ok = ok && e <= tol;
  }
  return ok;
}

// Trains `config` on both trainers and runs the checks; `label` prefixes every line.
// B x T tokens per micro-batch, K micro-batches per step.
void RunJob(const std::string& label, JobConfig config, int B, int T, int K, int steps) {
  auto Report = [&label](bool pass, const std::string& what) {
    ::Report(pass, label + ": " + what);
  };
  config.data_builtin = "tiny-corpus";
  config.steps = steps;
  config.seq_len = T;
  config.micro_batch = B;
  config.global_batch_tokens = int64_t{B} * T * K;
  config.lr = 3e-3;  // large enough that the curve moves visibly in a few steps
  config.warmup_steps = 2;
  config.precision = "bf16";
  const BatchShape shape = loom::train::ResolveBatchShape(config, loom::train::RankEnv{});
  const Dataset data =
      Dataset::Load("", config.data_builtin, "", config.model.vocab, config.seq_len);
  std::printf("== %s (L=%d C=%d NH=%d maxT=%d V=%d), B=%d T=%d K=%d, %d steps, lr %g\n",
              label.c_str(), config.model.layers, config.model.channels, config.model.heads,
              config.model.max_seq_len, config.model.vocab, shape.B, shape.T, shape.K, steps,
              config.lr);

  Trainer cpu(config, shape, data);
  // The timeline (h.): every step's phases into a trace ring.
  const std::string ring_path = "/tmp/loom-emu-trace-" + std::to_string(::getpid()) + ".ring";
  std::unique_ptr<loom::train::TraceRecorder> trace =
      loom::train::TraceRecorder::Open(ring_path, 0, 1);
  // The GPU rank as loom-train builds it: the CUDA backend behind the CPU's step loop.
  loom::train::CudaBackendOptions backend_options;
  backend_options.adam.weight_decay = static_cast<float>(config.weight_decay);
  auto backend = std::make_unique<CudaBackend>(
      config.model, loom::train::ModelShard{1, 0, 0, config.model.layers}, config.seed,
      backend_options);
  CudaBackend& device = *backend;
  loom::train::TrainerOptions trainer_options;
  trainer_options.trace = trace.get();
  Trainer gpu(config, shape, data, loom::train::TrainerComms{}, trainer_options,
              std::move(backend));
  const std::vector<TensorInfo>& table = cpu.model().tensors();

  // a. Initial parameters.
  const std::vector<float> p0_gpu = device.model().ParamsToHost();
  const std::vector<float> p0_cpu(cpu.model().params(),
                                  cpu.model().params() + cpu.model().num_params());
  bool ok = p0_gpu.size() == p0_cpu.size() &&
            gpu.backend().num_params() == cpu.model().num_params() &&
            device.model().padded_vocab() % 64 == 0 &&
            device.model().padded_vocab() >= config.model.vocab;
  ok = ok && CompareTensors(table, p0_gpu, p0_cpu.data(), kParamTol, "initial parameters");
  Report(ok, "a. initial parameters equal the CPU model's (" + std::to_string(p0_cpu.size()) +
                 " parameters, padded vocab " + std::to_string(device.model().padded_vocab()) +
                 ")");

  // b.-d. Steps.
  std::vector<StepResult> rc, rg;
  AllocatorStats after_first{};
  uint64_t mallocs_after_first = 0;
  for (int s = 0; s < steps; ++s) {
    rc.push_back(cpu.Step());
    rg.push_back(gpu.Step());
    if (s == 0) {
      after_first = device.model().memory_stats();
      mallocs_after_first = loom::emu::DeviceAllocCount();
      // The first AdamW update per tensor, a sensitive check of every tensor's gradient.
      const std::vector<float> p1_gpu = device.model().ParamsToHost();
      std::vector<float> du_gpu(p1_gpu.size()), du_cpu(p1_gpu.size());
      for (size_t i = 0; i < p1_gpu.size(); ++i) {
        du_gpu[i] = p1_gpu[i] - p0_gpu[i];
        du_cpu[i] = cpu.model().params()[i] - p0_cpu[i];
      }
      // The key bias's gradient is zero up to rounding (the softmax ignores a constant added
      // to a row), so AdamW moves it by +-lr at random on both sides: left out.
      const int C = config.model.channels;
      for (const TensorInfo& t : table) {
        if (t.name != "qkvb") continue;
        for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
          if ((i - t.offset) % (3 * C) / C == 1) du_gpu[i] = du_cpu[i] = 0.0f;
        }
      }
      Report(CompareTensors(table, du_gpu, du_cpu.data(), kUpdateTol, "first update"),
             "f. the first AdamW update of every tensor agrees (tol " +
                 std::to_string(kUpdateTol).substr(0, 4) + "; qkvb without the key bias)");
    }
  }
  std::printf("  step   cpu loss    gpu loss    rel      cpu |g|     gpu |g|     rel     lr\n");
  bool loss_ok = true, norm_ok = true;
  double worst_loss = 0.0, worst_norm = 0.0;
  for (int s = 0; s < steps; ++s) {
    const double el = RelDiff(rg[s].loss, rc[s].loss);
    const double en = RelDiff(rg[s].grad_norm, rc[s].grad_norm);
    std::printf("  %4lld  %10.6f  %10.6f  %7.4f  %10.6f  %10.6f  %7.4f  %.3g%s\n",
                static_cast<long long>(rg[s].step), rc[s].loss, rg[s].loss, el, rc[s].grad_norm,
                rg[s].grad_norm, en, rg[s].lr, rg[s].lr == rc[s].lr ? "" : " (lr differs)");
    loss_ok = loss_ok && std::isfinite(rg[s].loss) && el <= kLossTol && rg[s].step == rc[s].step;
    norm_ok =
        norm_ok && std::isfinite(rg[s].grad_norm) && en <= kGradNormTol && rg[s].lr == rc[s].lr;
    worst_loss = std::max(worst_loss, el);
    worst_norm = std::max(worst_norm, en);
  }
  char line[160];
  std::snprintf(line, sizeof line, "b. %d losses finite and within %.0f%% (worst %.3f%%)", steps,
                kLossTol * 100, worst_loss * 100);
  Report(loss_ok, line);
  std::snprintf(line, sizeof line, "c. %d gradient norms within %.0f%% (worst %.3f%%)", steps,
                kGradNormTol * 100, worst_norm * 100);
  Report(norm_ok, line);

  // e. Evaluation (after the steps, so the models have moved).
  const float eval_cpu = cpu.Evaluate();
  const float eval_gpu = gpu.Evaluate();
  const double ee = RelDiff(eval_gpu, eval_cpu);
  std::snprintf(line, sizeof line, "e. Evaluate: cpu %.6f gpu %.6f (rel %.3f%%, tol %.0f%%)",
                eval_cpu, eval_gpu, ee * 100, kEvalTol * 100);
  Report(std::isfinite(eval_gpu) && ee <= kEvalTol, line);

  // d. The steady state (every step after the first, and evaluation) allocates nothing.
  const AllocatorStats end = device.model().memory_stats();
  const uint64_t mallocs_end = loom::emu::DeviceAllocCount();
  std::snprintf(line, sizeof line,
                "d. no allocation after step 1: segments %llu -> %llu, allocator calls %llu -> "
                "%llu, cudaMalloc %llu -> %llu",
                static_cast<unsigned long long>(after_first.num_device_allocs),
                static_cast<unsigned long long>(end.num_device_allocs),
                static_cast<unsigned long long>(after_first.num_allocs),
                static_cast<unsigned long long>(end.num_allocs),
                static_cast<unsigned long long>(mallocs_after_first),
                static_cast<unsigned long long>(mallocs_end));
  Report(end.num_device_allocs == after_first.num_device_allocs &&
             end.num_allocs == after_first.num_allocs && mallocs_end == mallocs_after_first,
         line);
  std::printf("  allocator: %s; step memory %zu B, peak %zu B\n",
              loom::train::FormatStats(end).c_str(), rg.back().memory_bytes,
              rg.back().peak_memory_bytes);

  // The phase timer's event times (host time here): present and sane.
  const StepResult& last = rg.back();
  bool times_ok = last.times.step_seconds > 0.0;
  std::printf("  last gpu step %.3f s:", last.times.step_seconds);
  for (int p = 0; p < static_cast<int>(loom::train::Phase::kCount); ++p) {
    const double t = last.times.seconds[p];
    std::printf(" %s %.3f", loom::train::PhaseName(static_cast<loom::train::Phase>(p)), t);
    times_ok = times_ok && std::isfinite(t) && t >= 0.0 && t <= last.times.step_seconds * 1.01;
  }
  std::printf("\n");
  times_ok = times_ok && last.times.phase(loom::train::Phase::kForward) > 0.0 &&
             last.times.phase(loom::train::Phase::kBackward) > 0.0 &&
             last.times.phase(loom::train::Phase::kOptimizer) > 0.0;
  Report(times_ok, "g. phase times from CUDA events are finite and within the step");

  // g2. Per-block costs (profiler/block_costs.h) on the sampled step: every block, the
  // embedding and the head timed, positive, and together within the step.
  if (steps >= loom::train::kBlockSampleEvery) {
    const StepResult& sampled = rg[static_cast<size_t>(loom::train::kBlockSampleEvery - 1)];
    const loom::train::BlockCosts& bc = sampled.block_costs;
    bool costs_ok = sampled.has_block_costs && bc.has_embedding && bc.has_head &&
                    bc.first_block == 0 &&
                    static_cast<int>(bc.forward.size()) == config.model.layers &&
                    bc.backward.size() == bc.forward.size();
    double total =
        bc.embedding_forward + bc.embedding_backward + bc.head_forward + bc.head_backward;
    for (size_t l = 0; costs_ok && l < bc.forward.size(); ++l) {
      costs_ok = bc.forward[l] > 0.0 && bc.backward[l] > 0.0;
      total += bc.forward[l] + bc.backward[l];
    }
    costs_ok = costs_ok && bc.head_forward > 0.0 && bc.head_backward > 0.0 &&
               total <= sampled.times.step_seconds * 1.01;
    const bool others_clean = !rg.front().has_block_costs;
    Report(costs_ok && others_clean,
           "g2. per-block costs on sampled step " + std::to_string(loom::train::kBlockSampleEvery) +
               ": " + std::to_string(bc.forward.size()) + " blocks, embedding and head timed, " +
               std::to_string(total) + " s of a " + std::to_string(sampled.times.step_seconds) +
               " s step; step 1 unsampled");
  } else {
    std::printf("SKIP  g2. per-block costs: fewer than %lld steps\n",
                static_cast<long long>(loom::train::kBlockSampleEvery));
  }

  // h. The timeline: per step, K data, forward and backward records (micro-batches 0..K-1,
  // forward ending before its backward starts), an optimizer, all inside the step's record.
  using loom::train::TraceKind;
  using loom::train::TraceRecord;
  const loom::train::TraceReadResult ring = loom::train::ReadTraceFile(ring_path, 64 << 20);
  bool trace_ok = trace != nullptr && ring.ok && ring.torn == 0 && ring.invalid == 0;
  std::map<int64_t, std::vector<TraceRecord>> by_step;
  for (const TraceRecord& r : ring.records) by_step[r.step].push_back(r);
  trace_ok = trace_ok && static_cast<int>(by_step.size()) == steps;
  for (const auto& [step, records] : by_step) {
    const TraceRecord* whole = nullptr;
    std::map<int, int64_t> fwd_end, bwd_start;
    int data = 0, optimizer = 0;
    for (const TraceRecord& r : records) {
      if (r.kind == static_cast<uint16_t>(TraceKind::kStep)) whole = &r;
      if (r.kind == static_cast<uint16_t>(TraceKind::kData)) ++data;
      if (r.kind == static_cast<uint16_t>(TraceKind::kOptimizer)) ++optimizer;
      if (r.kind == static_cast<uint16_t>(TraceKind::kForward)) {
        fwd_end[r.micro] = r.start_ns + r.dur_ns;
      }
      if (r.kind == static_cast<uint16_t>(TraceKind::kBackward)) bwd_start[r.micro] = r.start_ns;
    }
    trace_ok = trace_ok && whole != nullptr && data == shape.K && optimizer == 1 &&
               static_cast<int>(fwd_end.size()) == shape.K && bwd_start.size() == fwd_end.size();
    for (const auto& [m, end] : fwd_end) trace_ok = trace_ok && end <= bwd_start[m];
    for (const TraceRecord& r : records) {
      // The device's clock placed on the host's: allow a millisecond at either end.
      trace_ok = trace_ok && whole != nullptr && r.start_ns >= whole->start_ns - 1'000'000 &&
                 r.start_ns + r.dur_ns <= whole->start_ns + whole->dur_ns + 1'000'000;
    }
  }
  if (!trace_ok) {
    for (const TraceRecord& r : ring.records) {
      std::printf("    record step %lld kind %s micro %d start %lld dur %lld\n",
                  static_cast<long long>(r.step), loom::train::TraceKindName(r.kind), r.micro,
                  static_cast<long long>(r.start_ns), static_cast<long long>(r.dur_ns));
    }
  }
  trace.reset();  // the trainer records nothing more
  std::remove(ring_path.c_str());
  Report(trace_ok, "h. the timeline: " + std::to_string(ring.records.size()) +
                       " records, per step K forward before backward, inside the step");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive an abort in the emulation
  const int steps = argc > 1 ? std::atoi(argv[1]) : 8;
  if (steps < 2) {
    std::fprintf(stderr, "usage: emu_train_check [steps >= 2]\n");
    return 2;
  }
  JobConfig tiny;
  tiny.preset = "tiny";
  tiny.model = *loom::train::PresetDims("tiny");  // L=2, C=64, NH=4, maxT=64, V=256
  // At least one sampled step (g2, the per-block costs) even in a short run.
  RunJob("tiny", tiny, /*B=*/2, /*T=*/32, /*K=*/2,
         std::max(steps, static_cast<int>(loom::train::kBlockSampleEvery)));
  // V = 256 needs no padding (a multiple of 64); 257 pads wte to 320 rows, 63 of padding.
  JobConfig padded = tiny;
  padded.preset.clear();
  padded.model.vocab = 257;
  RunJob("tiny-V257", padded, 2, 32, 2, steps);
  // Odd shapes: N = B*T = 87 rows, so per-layer activation offsets (l * N * C etc.) and the
  // attention's (B, NH, T, T) are not multiples of 8 elements; K = 3. Eight heads of 8 channels,
  // which the fused attention does not take: the two jobs above train on the fused kernels
  // (heads of 16), this one on the unfused ones.
  JobConfig odd = padded;
  odd.model.heads = 8;
  RunJob("tiny-V257-B3T29K3-HS8", odd, 3, 29, 3, std::max(2, steps / 2));

  const int shape_errors = loom::emu::ShapeErrors();
  Report(shape_errors == 0, "cuBLAS/cuBLASLt calls the real library accepts (" +
                                std::to_string(shape_errors) + " rejected)");
  std::printf("%s: %d failure(s)\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
