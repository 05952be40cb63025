#include "worker/train/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "kernels/grad_norm.h"
#include "worker/train/error.h"
#include "worker/train/trainer.h"

namespace loom::train {
namespace {

bool Alone(const Communicator* c) { return c == nullptr || c->size() == 1; }

// The optimizer's range: this dp rank's ZeRO-1 share, or the whole buffer.
ZeroRange UpdateRange(size_t n, const CpuBackendOptions& o) {
  if (o.zero1 && !Alone(o.dp)) return ZeroRangeOf(n, o.dp->size(), o.dp->rank());
  return ZeroRange{0, n, n};
}

// GradBuckets (host gradients, the communicator's thread) as the step loop's GradSync.
class CpuGradSync : public GradSync {
 public:
  CpuGradSync(GPT* model, size_t bucket_bytes, Communicator* dp)
      : model_(model), buckets_(model->tensors(), model->dims().layers, bucket_bytes, dp) {}
  void Begin() override { buckets_.Begin(model_->grads()); }
  void StageReady(int stage) override { buckets_.StageReady(stage); }
  void Finish() override { wait_seconds_ = buckets_.Finish(); }
  double wait_seconds() const override { return wait_seconds_; }
  double comm_seconds() const override { return buckets_.comm_seconds(); }
  size_t bytes_per_step() const override { return buckets_.bytes_per_step(); }
  size_t num_buckets() const override { return buckets_.num_buckets(); }
  std::vector<Span> spans() const override {
    std::vector<Span> out;
    for (const GradBuckets::Span& s : buckets_.spans()) {
      out.push_back(Span{TraceRecorder::Nanos(s.began), TraceRecorder::Nanos(s.done), s.bytes});
    }
    return out;
  }

 private:
  GPT* model_;
  GradBuckets buckets_;
  double wait_seconds_ = 0.0;
};

}  // namespace

CpuBackend::CpuBackend(const ModelDims& dims, const ModelShard& shard, uint64_t seed,
                       const CpuBackendOptions& options)
    : model_(dims, shard, shard.tp_size > 1 ? options.tp : nullptr),
      optimizer_(model_.num_params(), options.adam, UpdateRange(model_.num_params(), options).begin,
                 UpdateRange(model_.num_params(), options).end) {
  model_.InitWeights(seed);
  if (!Alone(options.dp)) {
    // ZeRO-1 reduce-scatters the gradients once after backward instead of all-reducing them in
    // buckets (parallel/zero_optimizer.h).
    if (options.zero1) {
      zero_ = std::make_unique<RangeGather>(model_.num_params(), options.dp);
    } else {
      sync_ = std::make_unique<CpuGradSync>(&model_, options.bucket_bytes, options.dp);
    }
  }
}

void CpuBackend::Reserve(int B, int T, int slots) {
  model_.Reserve(B, T, slots);
  stage_floats_ = static_cast<size_t>(B) * T * dims().channels;
  losses_.assign(slots, 0.0f);
}

void CpuBackend::ForwardMicro(int slot, const int* tokens, const void* input, const int* targets) {
  losses_[slot] = model_.ForwardMicro(slot, tokens, static_cast<const float*>(input), targets);
}

void CpuBackend::BackwardMicro(int slot, float loss_scale, const void* doutput,
                               const GradReadyFn& ready) {
  model_.BackwardMicro(slot, loss_scale, static_cast<const float*>(doutput), ready);
}

void* CpuBackend::NewStageBuffer() {
  LOOM_CHECK(stage_floats_ > 0, "NewStageBuffer before Reserve");
  stage_bufs_.emplace_back(stage_floats_);
  return stage_bufs_.back().data();
}

void CpuBackend::CopyStage(void* dst, const void* src) {
  std::memcpy(dst, src, stage_floats_ * sizeof(float));
}

size_t CpuBackend::SumEmbeddingGrad(Communicator* emb) {
  const TensorInfo& wte = model_.tensors()[0];
  LOOM_CHECK(wte.name == "wte" && wte.numel > 0, "an embedding-group rank without wte");
  emb->AllReduceSum(model_.grads() + wte.offset, wte.numel)->Wait();
  return wte.numel * sizeof(float);
}

size_t CpuBackend::ZeroReduceScatter(float scale) {
  LOOM_CHECK(zero_ != nullptr, "ZeroReduceScatter without ZeRO-1");
  zero_->ReduceScatter(model_.grads(), scale);
  return zero_->reduce_scatter_bytes();
}

size_t CpuBackend::ZeroGatherParams() {
  LOOM_CHECK(zero_ != nullptr, "ZeroGatherParams without ZeRO-1");
  zero_->Gather(model_.params() + optimizer_.begin(), model_.params());
  return zero_->bytes_per_call();
}

double CpuBackend::GradNorm() { return loom::train::GradNorm(model_.grads(), model_.tensors()); }

void CpuBackend::OwnedGradSumSquares(double* parts) {
  const size_t begin = optimizer_.begin(), end = optimizer_.end();
  const int layers = model_.dims().layers, first_block = model_.shard().first_block;
  for (const TensorInfo& t : model_.tensors()) {
    if (t.numel == 0 || !t.owner) continue;
    // A stacked tensor is summed block by block (each block's slice alike on every split).
    const size_t blocks = t.stacked ? static_cast<size_t>(t.shape[0]) : 1;
    const size_t per = t.numel / blocks;
    for (size_t b = 0; b < blocks; ++b) {
      const size_t lo = std::max(t.offset + b * per, begin);
      const size_t hi = std::min(t.offset + (b + 1) * per, end);
      if (lo >= hi) continue;
      parts[GradNormPart(layers, t.name, first_block + static_cast<int>(b))] +=
          loom::kernels::cpu::sum_of_squares(model_.grads() + lo, static_cast<long>(hi - lo));
    }
  }
}

void CpuBackend::ClipAndUpdate(double grad_norm, double max_norm, float lr) {
  const size_t begin = optimizer_.begin(), end = optimizer_.end();
  ClipGradients(model_.grads() + begin, end - begin, grad_norm, max_norm);
  optimizer_.Update(model_.params(), model_.grads(), model_.tensors(), lr);
}

Backend::HostState CpuBackend::StateToHost() {
  return HostState{model_.params(), optimizer_.m(), optimizer_.v()};
}

void CpuBackend::GatherState(std::vector<float>* params, std::vector<float>* m,
                             std::vector<float>* v) {
  LOOM_CHECK(zero_ != nullptr, "GatherState without ZeRO-1");
  params->clear();  // every rank holds all of the fp32 parameters
  m->assign(model_.num_params(), 0.0f);
  v->assign(model_.num_params(), 0.0f);
  zero_->Gather(optimizer_.m(), m->data());
  zero_->Gather(optimizer_.v(), v->data());
}

void CpuBackend::LoadState(const float* params, const float* m, const float* v,
                           int64_t optimizer_step) {
  LOOM_CHECK((m == nullptr) == (v == nullptr), "LoadState: m and v go together");
  const size_t range = optimizer_.end() - optimizer_.begin();
  if (params != model_.params()) {
    std::copy(params, params + model_.num_params(), model_.params());
  }
  if (m == nullptr) {
    std::fill(optimizer_.m(), optimizer_.m() + range, 0.0f);
    std::fill(optimizer_.v(), optimizer_.v() + range, 0.0f);
  } else {
    if (m != optimizer_.m()) std::copy(m, m + range, optimizer_.m());
    if (v != optimizer_.v()) std::copy(v, v + range, optimizer_.v());
  }
  optimizer_.set_step(optimizer_step);
}

void CpuBackend::FillMemory(size_t extra_bytes, StepResult* r) {
  memory_.Record(bytes_allocated() + extra_bytes);
  r->memory_bytes = memory_.in_use();
  r->peak_memory_bytes = memory_.peak();
  r->rss_bytes = ResidentSetBytes();
  // No caching allocator on the CPU: everything held is in use, nothing is fragmented and no
  // device memory is taken (memory_fragmentation, device_allocations stay 0).
  r->reserved_memory_bytes = r->memory_bytes;
  r->device = "cpu";
}

size_t CpuBackend::bytes_allocated() const {
  size_t buffers = 0;
  for (const std::vector<float>& b : stage_bufs_) buffers += b.capacity() * sizeof(float);
  return model_.bytes_allocated() + optimizer_.bytes_allocated() + buffers;
}

}  // namespace loom::train
