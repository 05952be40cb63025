#include "worker/train/cuda_trainer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/cuda/check.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/device/cuda_stream.h"
#include "worker/train/device/nvtx_range.h"
#include "worker/train/error.h"
#include "worker/train/profiler/step_profiler.h"
#ifdef LOOM_HAVE_NCCL
#include "worker/train/cuda_grad_sync.h"
#endif

namespace loom::train {
namespace {

// The GPU path holds the whole model on every rank: data parallelism at most (run.cc refuses
// other layouts first), over `dp` when there is more than one rank.
const BatchShape& WholeModel(const BatchShape& shape, const NcclCommunicator* dp) {
  LOOM_CHECK(shape.tp_size == 1 && shape.pp_size == 1,
             "the CUDA trainer holds the whole model on each rank (tensor = pipeline = 1)");
  LOOM_CHECK(shape.dp_size >= 1 && shape.dp_rank >= 0 && shape.dp_rank < shape.dp_size,
             "invalid data-parallel rank");
  LOOM_CHECK(shape.dp_size == 1 ||
                 (dp != nullptr && dp->size() == shape.dp_size && dp->rank() == shape.dp_rank),
             "data parallelism on the GPU needs the data-parallel NCCL group of this rank");
  LOOM_CHECK(!(shape.dp_size > 1 && shape.zero1), "ZeRO-1 is not supported on the GPU path");
  LOOM_CHECK(shape.B >= 1 && shape.T >= 1 && shape.K >= 1, "invalid batch shape");
  return shape;
}

}  // namespace

void CudaGradSyncDeleter::operator()(CudaGradSync* sync) const {
#ifdef LOOM_HAVE_NCCL
  delete sync;
#else
  LOOM_CHECK(sync == nullptr, "gradient buckets in a build without NCCL");
#endif
}

CudaTrainer::CudaTrainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                         int device, std::unique_ptr<NcclCommunicator> dp, size_t bucket_bytes,
                         bool dp_overlap)
    : config_(config),
      shape_(WholeModel(shape, dp.get())),
      model_(config.model, device),
      schedule_{config.lr, config.warmup_steps, config.steps, config.min_lr_ratio},
      // This dp rank's micro-batches of the global batch, as the CPU trainer's.
      sampler_(data.train(), config.seed, shape.B, shape.T, shape.K, shape.dp_rank),
      eval_batches_(data.val(), shape.B, shape.T, kMaxEvalBatches),
      timer_(model_.stream()),
      dp_overlap_(dp_overlap) {
  if (shape_.dp_size > 1) {
#ifdef LOOM_HAVE_NCCL
    dp_ = std::move(dp);
    sync_.reset(new CudaGradSync(&model_, dp_.get(), bucket_bytes));
#else
    LOOM_CHECK(false, "data parallelism on the GPU needs a build with NCCL");
#endif
  }
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
  const int64_t trace_start = trace_ ? trace_->BeginStep(step_ + 1) : 0;
  timer_.BeginStep();
  model_.ZeroGrad();
  const int dp = shape_.dp_size;
#ifdef LOOM_HAVE_NCCL
  if (sync_) sync_->Begin();
#endif
  // The last micro-batch's backward issues the gradient buckets as their stages finish; the
  // earlier ones only accumulate, so a step communicates once (as the CPU trainer).
  GptCuda::GradReadyFn ready;
#ifdef LOOM_HAVE_NCCL
  if (sync_ && dp_overlap_) ready = [this](int stage) { sync_->StageReady(stage); };
#endif
  double loss_sum = 0.0;
  for (int m = 0; m < K; ++m) {
    timer_.Enter(Phase::kData);
    sampler_.Fill(step_, m, inputs_.data(), targets_.data());
    timer_.Enter(Phase::kForward);
    model_.Forward(inputs_.data(), targets_.data());
    timer_.Enter(Phase::kBackward);
    // The step's loss is the mean over its K micro-batches, and over the dp ranks: with the
    // scale 1/(K * dp) the group's SUM of the gradients (the all-reduce) is their mean.
    model_.Backward(1.0f / (static_cast<float>(K) * static_cast<float>(dp)),
                    m == K - 1 ? ready : GptCuda::GradReadyFn());
    // As the CPU model: each micro-batch's mean loss as a float, summed in double. Reading it
    // back synchronises once per micro-batch, after its backward is queued (the buckets'
    // all-reduces go on meanwhile, on the communication stream).
    loss_sum += static_cast<float>(model_.LossSum() / N);
  }
  float loss = static_cast<float>(loss_sum / K);
#ifdef LOOM_HAVE_NCCL
  if (sync_) {
    // The compute stream's wait for the buckets is the exposed communication.
    timer_.Enter(Phase::kCommExposed);
    sync_->Finish();
    // The global batch's mean loss, as the CPU trainer's: each rank's mean / dp, summed.
    sync_->StartScalarSum(loss / static_cast<float>(dp));
    loss = sync_->WaitHost();  // CommError when a peer died or hung
    r.comm.dp_all_reduce = sync_->bytes_per_step();
    r.comm.world_all_reduce = sizeof(float);
  }
#endif
  timer_.Enter(Phase::kOptimizer);
  // After the sum: the same gradients, so the same norm and clipping, on every rank.
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
  if (trace_) RecordTimeline(trace_start);
  const double step_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) r.times.seconds[p] = phases[p];
  r.times.step_seconds = step_s;
  r.times.tokens_per_second = step_s > 0.0 ? N * K / step_s : 0.0;
  r.step = step_;
  r.loss = loss;
  r.allreduce_bytes = r.comm.dp_all_reduce;
  const double exposed = r.times.phase(Phase::kCommExposed);
  if (step_s > 0.0) r.idle_ratio = std::clamp(exposed / step_s, 0.0, 1.0);
#ifdef LOOM_HAVE_NCCL
  if (sync_) {
    // Device time from the buckets' events (the stream has run the step: EndStep).
    r.dp_comm_seconds = sync_->comm_seconds();
    if (r.dp_comm_seconds > 0.0) {
      r.overlap_ratio = std::clamp(1.0 - sync_->wait_seconds() / r.dp_comm_seconds, 0.0, 1.0);
    }
  }
#endif
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
  r.device = "cuda:" + std::to_string(model_.device());
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

CudaTrainer::~CudaTrainer() = default;

void CudaTrainer::RecordTimeline(int64_t step_start) {
  int micro = -1;
  for (const CudaPhaseTimer::Span& s : timer_.spans()) {
    TraceKind kind;
    switch (s.phase) {
      case Phase::kData:
        kind = TraceKind::kData;
        ++micro;
        break;
      case Phase::kForward:
        kind = TraceKind::kForward;
        break;
      case Phase::kBackward:
        kind = TraceKind::kBackward;
        break;
      case Phase::kCommExposed:
        kind = TraceKind::kDpWait;
        break;
      case Phase::kOptimizer:
        kind = TraceKind::kOptimizer;
        break;
      default:
        continue;
    }
    const bool per_micro =
        kind == TraceKind::kData || kind == TraceKind::kForward || kind == TraceKind::kBackward;
    trace_->Record(kind, step_start + std::llround(s.start * 1e9),
                   step_start + std::llround(s.end * 1e9), per_micro ? micro : -1, 0,
                   per_micro && kind != TraceKind::kData ? 0 : -1);
  }
  trace_->Since(TraceKind::kStep, step_start, -1);
}

size_t CudaTrainer::num_buckets() const {
#ifdef LOOM_HAVE_NCCL
  if (sync_) return sync_->num_buckets();
#endif
  return 0;
}

std::vector<int64_t> CudaTrainer::GatherResumeSteps(int64_t step) {
  if (!dp_) return {step};
  const size_t n = static_cast<size_t>(shape_.dp_size);
  // Once, at start: a small allocation from the model's allocator, given back at once.
  CachingAllocator* allocator = model_.allocator();
  const StreamId stream = ToStreamId(model_.stream());
  float* in = static_cast<float*>(allocator->Allocate(sizeof(float), stream));       // (1)
  float* out = static_cast<float*>(allocator->Allocate(n * sizeof(float), stream));  // (dp)
  allocator->RecordStream(in, ToStreamId(dp_->stream()));
  allocator->RecordStream(out, ToStreamId(dp_->stream()));
  const float mine = static_cast<float>(step);
  std::vector<float> all(n, 0.0f);
  LOOM_CUDA_CHECK(cudaMemcpy(in, &mine, sizeof(float), cudaMemcpyHostToDevice));
  dp_->AllGather(in, out, 1)->Wait();  // host wait first: CommError rather than a hang
  dp_->StreamWaitAll(model_.stream());
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(all.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, model_.stream()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
  allocator->Free(in);
  allocator->Free(out);
  std::vector<int64_t> steps;
  for (float s : all) steps.push_back(static_cast<int64_t>(s));
  return steps;
}

std::unique_ptr<DeviceTrainer> MakeCudaTrainer(const JobConfig& config, const BatchShape& shape,
                                               const Dataset& data, int device,
                                               const DeviceTrainerOptions& options) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    throw BadInput("--device", "no CUDA device " + std::to_string(device) + " (this machine has " +
                                   std::to_string(count) + ")");
  }
  if (shape.dp_size == 1) return std::make_unique<CudaTrainer>(config, shape, data, device);
#ifdef LOOM_HAVE_NCCL
  // The store is needed only while the ranks meet.
  std::unique_ptr<KeyValueStore> store = OpenRendezvousStore(options.rendezvous);
  NcclOptions o;
  o.rank = shape.dp_rank;
  o.size = shape.dp_size;
  o.device = device;
  o.store = store.get();
  o.group = "dp";
  o.timeout = options.rendezvous.timeout;  // LOOM_COMM_TIMEOUT_S
  std::unique_ptr<NcclCommunicator> dp = ConnectNccl(o);
  return std::make_unique<CudaTrainer>(config, shape, data, device, std::move(dp),
                                       options.bucket_bytes, options.dp_overlap);
#else
  (void)options;
  throw BadInput("--device",
                 "data parallelism on the GPU needs NCCL, and this loom-train was built without "
                 "it (data " +
                     std::to_string(shape.dp_size) + "); use --device cpu or a build with NCCL");
#endif
}

}  // namespace loom::train
