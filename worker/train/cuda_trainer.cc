#include "worker/train/cuda_trainer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "worker/train/device/cuda_memory.h"
#include "worker/train/device/nvtx_range.h"
#include "worker/train/error.h"
#include "worker/train/profiler/step_profiler.h"

namespace loom::train {
namespace {

// The GPU path holds the whole model on one rank (run.cc refuses other layouts first).
const BatchShape& OneRank(const BatchShape& shape) {
  LOOM_CHECK(shape.dp_size == 1 && shape.tp_size == 1 && shape.pp_size == 1,
             "the CUDA trainer runs one rank holding the whole model");
  LOOM_CHECK(shape.B >= 1 && shape.T >= 1 && shape.K >= 1, "invalid batch shape");
  return shape;
}

}  // namespace

CudaTrainer::CudaTrainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                         int device)
    : config_(config),
      shape_(OneRank(shape)),
      model_(config.model, device),
      schedule_{config.lr, config.warmup_steps, config.steps, config.min_lr_ratio},
      sampler_(data.train(), config.seed, shape.B, shape.T, shape.K, /*dp_rank=*/0),
      eval_batches_(data.val(), shape.B, shape.T, kMaxEvalBatches),
      timer_(model_.stream()) {
  // As the CPU trainer's optimizer (trainer.cc AdamFrom): the defaults but the weight decay.
  adam_.weight_decay = static_cast<float>(config.weight_decay);
  model_.InitWeights(config.seed);
  model_.Reserve(shape_.B, shape_.T);
  const size_t bt = static_cast<size_t>(shape_.B) * shape_.T;
  inputs_.assign(bt, 0);
  targets_.assign(bt, 0);
}

StepResult CudaTrainer::Step() {
  using Clock = std::chrono::steady_clock;
  const int B = shape_.B, T = shape_.T, K = shape_.K;
  const double N = static_cast<double>(B) * T;
  StepResult r;
  const Clock::time_point start = Clock::now();
  NvtxRange step_range("step");
  timer_.BeginStep();
  model_.ZeroGrad();
  double loss_sum = 0.0;
  for (int m = 0; m < K; ++m) {
    timer_.Enter(Phase::kData);
    sampler_.Fill(step_, m, inputs_.data(), targets_.data());
    timer_.Enter(Phase::kForward);
    model_.Forward(inputs_.data(), targets_.data());
    timer_.Enter(Phase::kBackward);
    // The step's loss is the mean over its K micro-batches.
    model_.Backward(1.0f / static_cast<float>(K));
    // As the CPU model: each micro-batch's mean loss as a float, summed in double. Reading it
    // back synchronises once per micro-batch, after its backward is queued.
    loss_sum += static_cast<float>(model_.LossSum() / N);
  }
  timer_.Enter(Phase::kOptimizer);
  const float loss = static_cast<float>(loss_sum / K);
  r.grad_norm = model_.GradNorm();
  if (!std::isfinite(loss)) {
    throw BadInput("train.lr", "the loss became " + std::to_string(loss) + " at step " +
                                   std::to_string(step_ + 1) +
                                   ": training diverged (lower the learning rate)");
  }
  // Clipping as ClipGradients (optim/adamw.h), folded into the AdamW update as a gradient scale.
  float grad_scale = 1.0f;
  if (config_.grad_clip > 0.0 && r.grad_norm > config_.grad_clip) {
    grad_scale = static_cast<float>(config_.grad_clip / r.grad_norm);
  }
  r.lr = LearningRate(schedule_, step_);
  model_.Update(adam_, static_cast<float>(r.lr), grad_scale, ++optimizer_step_);
  ++step_;
  const PhaseSeconds phases = timer_.EndStep();  // waits for the stream
  const double step_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) r.times.seconds[p] = phases[p];
  r.times.step_seconds = step_s;
  r.times.tokens_per_second = step_s > 0.0 ? N * K / step_s : 0.0;
  r.step = step_;
  r.loss = loss;
  const AllocatorStats stats = model_.memory_stats();
  r.memory_bytes = stats.allocated + model_.fixed_bytes();
  r.peak_memory_bytes = stats.peak_allocated + model_.fixed_bytes();
  r.rss_bytes = ResidentSetBytes();
  // The GEMM workspace is held outside the allocator for the whole run: reserved as well.
  r.reserved_memory_bytes = stats.reserved + model_.fixed_bytes();
  r.memory_fragmentation = std::clamp(stats.fragmentation, 0.0, 1.0);
  r.device_allocations = stats.num_device_allocs - alloc_watch_.seen;
  alloc_watch_.seen = stats.num_device_allocs;
  ++alloc_watch_.steps;
  int device = 0;
  r.device = cudaGetDevice(&device) == cudaSuccess ? "cuda:" + std::to_string(device) : "cuda";
  if (r.device_allocations > 0 && alloc_watch_.steps > DeviceAllocWatch::kAllocFreeAfterSteps &&
      !alloc_watch_.warned) {
    // Each new segment is a cudaMalloc, which synchronises the device: a step that keeps
    // allocating is slower than it needs to be. Once per run, so that the log stays readable.
    alloc_watch_.warned = true;
    std::fprintf(
        stderr,
        "loom-train: warning: step %lld took %llu new device memory segment(s) "
        "(cudaMalloc) after the first %lld steps; the steady state is not "
        "allocation-free (%s)\n",
        static_cast<long long>(r.step), static_cast<unsigned long long>(r.device_allocations),
        static_cast<long long>(DeviceAllocWatch::kAllocFreeAfterSteps), FormatStats(stats).c_str());
  }
  return r;
}

float CudaTrainer::Evaluate() {
  NvtxRange range("evaluate");
  const double N = static_cast<double>(shape_.B) * shape_.T;
  double sum = 0.0;
  for (int i = 0; i < eval_batches_.num_batches(); ++i) {
    eval_batches_.Fill(i, inputs_.data(), targets_.data());
    model_.Forward(inputs_.data(), targets_.data());
    sum += static_cast<float>(model_.LossSum() / N);
  }
  return static_cast<float>(sum / eval_batches_.num_batches());
}

std::unique_ptr<DeviceTrainer> MakeCudaTrainer(const JobConfig& config, const BatchShape& shape,
                                               const Dataset& data, int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    throw BadInput("--device", "no CUDA device " + std::to_string(device) + " (this machine has " +
                                   std::to_string(count) + ")");
  }
  return std::make_unique<CudaTrainer>(config, shape, data, device);
}

}  // namespace loom::train
