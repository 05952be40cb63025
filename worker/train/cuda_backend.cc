#include "worker/train/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/cuda_zero.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/device/cuda_stream.h"
#include "worker/train/error.h"
#include "worker/train/parallel/process_groups.h"
#include "worker/train/trainer.h"
#ifdef LOOM_HAVE_NCCL
#include "worker/train/cuda_grad_sync.h"
#endif

namespace loom::train {
namespace {

// The model's master range: this dp rank's ZeRO-1 range, or the whole shard.
GptCuda::MasterRange MasterRangeOf(const ModelDims& dims, const ModelShard& shard,
                                   const CudaBackendOptions& o) {
  if (!o.zero1 || o.dp == nullptr || o.dp->size() == 1) return GptCuda::MasterRange{};
  const ZeroRange r =
      CudaZero::RangeOf(ParamCount(ShardTable(dims, shard)), o.dp->size(), o.dp->rank());
  return GptCuda::MasterRange{r.begin, r.end};
}

#ifdef LOOM_HAVE_NCCL
// CudaGradSync (bf16 buckets on the communication stream) as the step loop's GradSync. Finish
// also blocks the host until the collectives completed, so that a dead or hung peer ends in
// CommError within the communicator's timeout instead of a stream that never drains.
class CudaGradSyncAdapter : public GradSync {
 public:
  CudaGradSyncAdapter(GptCuda* model, NcclCommunicator* dp, size_t bucket_bytes)
      : sync_(model, dp, bucket_bytes) {}
  void Begin() override { sync_.Begin(); }
  void StageReady(int stage) override { sync_.StageReady(stage); }
  void Finish() override {
    sync_.Finish();
    (void)sync_.WaitHost();
  }
  double wait_seconds() const override { return sync_.wait_seconds(); }
  double comm_seconds() const override { return sync_.comm_seconds(); }
  size_t bytes_per_step() const override { return sync_.bytes_per_step(); }
  size_t num_buckets() const override { return sync_.num_buckets(); }
  std::vector<Span> spans() const override { return {}; }  // device time: not on the host clock

 private:
  CudaGradSync sync_;
};
#endif

}  // namespace

CudaBackend::CudaBackend(const ModelDims& dims, const ModelShard& shard, uint64_t seed,
                         const CudaBackendOptions& options)
    : options_(options),
      model_(dims, options.device, shard, shard.tp_size > 1 ? options.tp : nullptr,
             MasterRangeOf(dims, shard, options), options.fused_attention),
      timer_(model_.stream()) {
  model_.InitWeights(seed);
  for (NcclCommunicator* c :
       {options_.world, options_.dp, options_.tp, options_.pp, options_.emb, options_.pp_grad}) {
    if (c != nullptr) {
      LOOM_CHECK(c->device() == options_.device, "a communicator on another device");
      c->SetComputeStream(model_.stream());
    }
  }
  if (options_.dp != nullptr && options_.dp->size() > 1) {
    dp_size_ = options_.dp->size();
    if (options_.zero1) {
      zero_ = std::make_unique<CudaZero>(&model_, options_.dp, options_.zero_piece);
    } else {
#ifdef LOOM_HAVE_NCCL
      sync_ = std::make_unique<CudaGradSyncAdapter>(&model_, options_.dp, options_.bucket_bytes);
#else
      LOOM_CHECK(false, "data parallelism on the GPU needs a build with NCCL");
#endif
    }
  }
  host_scalars_ = static_cast<float*>(
      model_.allocator()->Allocate(kHostScalars * sizeof(float), ToStreamId(model_.stream())));
}

CudaBackend::~CudaBackend() {
  sync_.reset();
  zero_.reset();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
  model_.allocator()->Free(host_scalars_);
  for (void* p : stage_bufs_) model_.allocator()->Free(p);
}

std::string CudaBackend::device_name() const { return "cuda:" + std::to_string(options_.device); }

void CudaBackend::Reserve(int B, int T, int slots) {
  model_.Reserve(B, T, slots);
  stage_floats_ = (static_cast<size_t>(B) * T * model_.dims().channels + 1) / 2;
}

void CudaBackend::ForwardMicro(int slot, const int* tokens, const void* input, const int* targets) {
  model_.ForwardMicro(slot, tokens, static_cast<const GptCuda::bf16*>(input), targets);
}

float CudaBackend::TakeLoss(int slot) {
  // As the CPU model: the micro-batch's mean loss as a float (summed in double on the host).
  const double n = static_cast<double>(model_.batch()) * model_.seq_len();
  return static_cast<float>(model_.LossSum(slot) / n);
}

const void* CudaBackend::Output(int slot) const { return model_.Output(slot); }

void CudaBackend::BackwardMicro(int slot, float loss_scale, const void* doutput,
                                const GradReadyFn& ready) {
  // The buckets (or ZeRO-1's reduce-scatter) sum the dp ranks' gradients: each rank's share of
  // the mean is 1/dp of its own, applied here, before the bf16 sum, as the buckets always did.
  const float scale = loss_scale / static_cast<float>(dp_size_);
  model_.BackwardMicro(slot, scale, static_cast<const GptCuda::bf16*>(doutput), ready);
}

const void* CudaBackend::InputGrad() const { return model_.InputGrad(); }

size_t CudaBackend::stage_bytes_exact() const {
  return static_cast<size_t>(model_.batch()) * model_.seq_len() * model_.dims().channels *
         sizeof(GptCuda::bf16);
}

void* CudaBackend::NewStageBuffer() {
  LOOM_CHECK(stage_floats_ > 0, "NewStageBuffer before Reserve");
  CachingAllocator* allocator = model_.allocator();
  void* p = allocator->Allocate(stage_floats_ * sizeof(float), ToStreamId(model_.stream()));
  // The pipeline communicator reads and writes it on its own stream.
  for (NcclCommunicator* c : {options_.pp, options_.pp_grad}) {
    if (c != nullptr) allocator->RecordStream(p, ToStreamId(c->stream()));
  }
  stage_bufs_.push_back(p);
  return p;
}

void CudaBackend::CopyStage(void* dst, const void* src) {
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, stage_bytes_exact(), cudaMemcpyDeviceToDevice, model_.stream()));
}

size_t CudaBackend::tp_all_reduce_bytes() const { return stage_bytes_exact(); }

void CudaBackend::AllReduceHost(Communicator* comm, float* data, size_t n) {
  if (comm == nullptr || comm->size() == 1) return;  // the sum over one rank
  auto* nccl = dynamic_cast<NcclCommunicator*>(comm);
  LOOM_CHECK(nccl != nullptr, "AllReduceHost on a group that is not this device's NCCL group");
  cudaStream_t stream = model_.stream();
  nccl->SetComputeStream(stream);
  // In pieces of the staging buffer's size (a resume agreement carries one value per rank).
  for (size_t begin = 0; begin < n; begin += kHostScalars) {
    const size_t count = std::min(kHostScalars, n - begin);
    // A pageable source: the call returns once the values have been read.
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, data + begin, count * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    // The host waits through the communicator's watchdog first: a dead peer is a CommError, not
    // a stream that never drains.
    nccl->AllReduceSum(host_scalars_, count)->Wait();
    nccl->StreamWaitAll(stream);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(data + begin, host_scalars_, count * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

size_t CudaBackend::SumEmbeddingGrad(Communicator* emb) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(emb);
  LOOM_CHECK(nccl != nullptr, "the embedding group is not this device's NCCL group");
  const PaddedLayout& layout = model_.layout();
  LOOM_CHECK(model_.tensors()[0].name == "wte" && layout.numel[0] > 0,
             "an embedding-group rank without wte");
  // wte's gradient with its padding rows (zero on both stages), in bf16, summed in place. The
  // host waits through the watchdog (CommError rather than a hang); the stream on the device.
  nccl->AllReduceSum(model_.grads() + layout.offset[0], layout.numel[0], DeviceDType::kBFloat16)
      ->Wait();
  nccl->StreamWaitAll(model_.stream());
  return layout.numel[0] * sizeof(GptCuda::bf16);
}

size_t CudaBackend::ZeroReduceScatter(float scale) {
  LOOM_CHECK(zero_ != nullptr, "ZeroReduceScatter without ZeRO-1");
  // The 1/dp of the mean was applied in BackwardMicro (before the bf16 sum).
  LOOM_CHECK(std::fabs(scale * static_cast<float>(dp_size_) - 1.0f) < 1e-6f,
             "the GPU's ZeRO-1 applies 1/dp in backward: the trainer must ask for the dp mean");
  return zero_->ReduceScatter();
}

size_t CudaBackend::ZeroGatherParams() {
  LOOM_CHECK(zero_ != nullptr, "ZeroGatherParams without ZeRO-1");
  return zero_->GatherParams();
}

void CudaBackend::OwnedGradSumSquares(double* parts) { model_.OwnedSumSquares(parts); }

void CudaBackend::ClipAndUpdate(double grad_norm, double max_norm, float lr) {
  // Clipping as ClipGradients (optim/adamw.h), folded into the AdamW update as a gradient scale.
  float grad_scale = 1.0f;
  if (max_norm > 0.0 && grad_norm > max_norm) grad_scale = static_cast<float>(max_norm / grad_norm);
  model_.Update(options_.adam, lr, grad_scale, ++optimizer_step_);
}

Backend::HostState CudaBackend::StateToHost() {
  host_state_ = model_.StateToHost();
  return HostState{host_state_.params.data(), host_state_.m.data(), host_state_.v.data()};
}

void CudaBackend::GatherState(std::vector<float>* params, std::vector<float>* m,
                              std::vector<float>* v) {
  LOOM_CHECK(zero_ != nullptr, "GatherState without ZeRO-1");
  zero_->GatherState(params, m, v);
}

void CudaBackend::LoadState(const float* params, const float* m, const float* v,
                            int64_t optimizer_step) {
  model_.LoadState(params, m, v);
  optimizer_step_ = optimizer_step;
}

void CudaBackend::BeginStep() {
  step_start_ = std::chrono::steady_clock::now();
  timer_.BeginStep();
}

StepTimes CudaBackend::EndStep(int64_t tokens) {
  const PhaseSeconds phases = timer_.EndStep();  // waits for the stream
  StepTimes t;
  for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) t.seconds[p] = phases[p];
  t.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  t.tokens_per_second = t.step_seconds > 0.0 ? static_cast<double>(tokens) / t.step_seconds : 0.0;
  return t;
}

void CudaBackend::FillMemory(size_t extra_bytes, StepResult* r) {
  (void)extra_bytes;  // host memory: not the device's
  const AllocatorStats stats = model_.memory_stats();
  r->memory_bytes = stats.allocated + model_.fixed_bytes();
  r->peak_memory_bytes = stats.peak_allocated + model_.fixed_bytes();
  r->rss_bytes = ResidentSetBytes();
  // The GEMM workspace is held outside the allocator for the whole run: reserved as well.
  r->reserved_memory_bytes = stats.reserved + model_.fixed_bytes();
  r->memory_fragmentation = std::clamp(stats.fragmentation, 0.0, 1.0);
  r->device_allocations = stats.num_device_allocs - allocs_seen_;
  allocs_seen_ = stats.num_device_allocs;
  ++steps_seen_;
  r->device = device_name();
  if (r->device_allocations > 0 && steps_seen_ > kAllocFreeAfterSteps && !alloc_warned_) {
    // Each new segment is a cudaMalloc, which synchronises the device: a step that keeps
    // allocating is slower than it needs to be. Once per run, so that the log stays readable.
    alloc_warned_ = true;
    std::fprintf(stderr,
                 "loom-train: warning: step %lld took %llu new device memory segment(s) "
                 "(cudaMalloc) after the first %lld steps; the steady state is not "
                 "allocation-free (%s)\n",
                 static_cast<long long>(r->step),
                 static_cast<unsigned long long>(r->device_allocations),
                 static_cast<long long>(kAllocFreeAfterSteps), FormatStats(stats).c_str());
  }
}

size_t CudaBackend::bytes_allocated() const {
  return model_.memory_stats().allocated + model_.fixed_bytes();
}

std::unique_ptr<Backend> MakeCudaRankBackend(const JobConfig& config, const BatchShape& shape,
                                             int device, const RendezvousConfig& rendezvous,
                                             size_t bucket_bytes, ProcessGroups* groups) {
  // Before any CUDA call: a configuration the device cannot run is the user's to fix.
  if (config.attention == "fused" &&
      !kernels::cuda::launch::FlashAttentionSupported(config.model.channels, config.model.heads)) {
    throw BadInput("train.attention",
                   "fused attention needs heads of a multiple of 16 channels up to " +
                       std::to_string(kernels::cuda::launch::kFlashMaxHeadSize) + " (hidden " +
                       std::to_string(config.model.channels) + " / heads " +
                       std::to_string(config.model.heads) + "); use auto or unfused");
  }
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    throw BadInput("--device", "no CUDA device " + std::to_string(device) + " (this machine has " +
                                   std::to_string(count) + ")");
  }
  const int world = shape.dp_size * shape.tp_size * shape.pp_size;
  if (world == 1) {
    *groups = ProcessGroups::Alone();
  } else {
#ifdef LOOM_HAVE_NCCL
    // The store is needed only while the ranks meet.
    std::unique_ptr<KeyValueStore> store = OpenRendezvousStore(rendezvous);
    // `name` is unique per group instance: its own NCCL unique id in the store.
    auto connect = [&](const GroupSpec& spec, const std::string& name) {
      NcclOptions o;
      o.rank = spec.rank;
      o.size = spec.size;
      o.device = device;
      o.store = store.get();
      o.group = name;
      o.timeout = rendezvous.timeout;  // LOOM_COMM_TIMEOUT_S
      return ConnectNccl(o);
    };
    for (const GroupSpec& spec : GroupsOf(shape, rendezvous.rank)) {
      std::unique_ptr<Communicator> comm;
      if (spec.size == 1) {
        comm = std::make_unique<SingleRankCommunicator>();
      } else {
        comm = connect(spec, spec.name);
      }
      if (spec.name.rfind("pp.", 0) == 0 && spec.size > 1) {
        // NCCL matches messages by posting order on one stream per communicator: the gradients
        // travel on a second one (ProcessGroups::pp_grad), so that a stage's activation sends
        // and gradient receives never wait for each other's peers in a cycle.
        groups->pp_grad = connect(spec, spec.name + ".grad");
      }
      const std::string& n = spec.name;
      std::unique_ptr<Communicator>* slot = n == "world"             ? &groups->world
                                            : n.rfind("tp.", 0) == 0 ? &groups->tp
                                            : n.rfind("dp.", 0) == 0 ? &groups->dp
                                            : n.rfind("pp.", 0) == 0 ? &groups->pp
                                                                     : &groups->emb;
      *slot = std::move(comm);
    }
#else
    (void)rendezvous;
    throw BadInput("--device",
                   "data parallelism on the GPU needs NCCL, and this loom-train was built without "
                   "it (data " +
                       std::to_string(shape.dp_size) + "); use --device cpu or a build with NCCL");
#endif
  }
  CudaBackendOptions o;
  o.adam.weight_decay = static_cast<float>(config.weight_decay);
  o.device = device;
  o.world = dynamic_cast<NcclCommunicator*>(groups->world.get());
  o.dp = dynamic_cast<NcclCommunicator*>(groups->dp.get());
  o.tp = dynamic_cast<NcclCommunicator*>(groups->tp.get());
  o.pp = dynamic_cast<NcclCommunicator*>(groups->pp.get());
  o.emb = dynamic_cast<NcclCommunicator*>(groups->emb.get());
  o.pp_grad = dynamic_cast<NcclCommunicator*>(groups->pp_grad.get());
  o.bucket_bytes = bucket_bytes;
  o.zero1 = shape.zero1 && shape.dp_size > 1;
  o.fused_attention = config.attention != "unfused";
  const ModelShard shard{shape.tp_size, shape.tp_rank, shape.first_block(), shape.last_block()};
  return std::make_unique<CudaBackend>(config.model, shard, config.seed, o);
}

}  // namespace loom::train
