#include "worker/train/model/gpt_cuda.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/crossentropy.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/grad_norm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/residual.h"
#include "worker/train/device/cuda_stream.h"
#include "worker/train/error.h"
#include "worker/train/model/block_pass.h"
#include "worker/train/model/stage_pass.h"

namespace loom::train {

namespace kc = loom::kernels::cuda;
namespace launch = loom::kernels::cuda::launch;

namespace {

// The ParamTable's order (params.h); View relies on it.
constexpr const char* kTensorNames[kNumParamTensors] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

}  // namespace

GptCuda::GptCuda(const ModelDims& dims, int device, const ModelShard& shard, NcclCommunicator* tp,
                 MasterRange range, bool fused_attention)
    : dims_(dims), device_(device), shard_(shard) {
  LOOM_CHECK(DimsProblem(dims).empty(), "invalid model dimensions: " + DimsProblem(dims));
  const std::string problem = ShardProblem(dims, shard);
  LOOM_CHECK(problem.empty(), "invalid model shard: " + problem);
  if (shard_.last_block == -1) shard_.last_block = dims.layers;
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (shard_.tp_size > 1) {
    LOOM_CHECK(tp != nullptr && tp->size() == shard_.tp_size && tp->rank() == shard_.tp_rank &&
                   tp->device() == device,
               "tensor parallelism needs the tp group's NCCL communicator on this device (size "
               "tp_size, rank tp_rank)");
    tp_ = tp;
    tp_->SetComputeStream(stream_);
  }
  gemm_ = std::make_unique<kc::GemmContext>();
  memory_ = std::make_unique<CudaMemory>();
  allocator_ = std::make_unique<CachingAllocator>(memory_.get());

  table_ = ShardTable(dims, shard_);
  LOOM_CHECK(static_cast<int>(table_.size()) == kNumParamTensors, "unexpected parameter table");
  for (int i = 0; i < kNumParamTensors; ++i) {
    LOOM_CHECK(table_[i].name == kTensorNames[i], "unexpected parameter table order");
  }
  blocks_ = shard_.last_block - shard_.first_block;
  heads_local_ = dims.heads / shard_.tp_size;
  qkv_local_ = dims.channels / shard_.tp_size;
  flash_ = fused_attention && launch::FlashAttentionSupported(qkv_local_, heads_local_);
  mlp_local_ = 4 * dims.channels / shard_.tp_size;
  num_params_ = ParamCount(table_);
  layout_ = MakePaddedLayout(table_, kVocabMultiple);
  range_.begin = range.begin;
  range_.end = std::min(range.end, num_params_);
  LOOM_CHECK(range_.begin <= range_.end, "the master range starts past the shard's parameters");
  const size_t n = layout_.total;
  // An empty range (a ZeRO-1 rank past the end) still gets one element: no zero-byte blocks.
  const size_t held = std::max<size_t>(range_.end - range_.begin, 1);
  params_ = static_cast<bf16*>(Alloc(n * sizeof(bf16)));
  grads_ = static_cast<bf16*>(Alloc(n * sizeof(bf16)));
  master_ = static_cast<float*>(Alloc(held * sizeof(float)));
  m_ = static_cast<float*>(Alloc(held * sizeof(float)));
  v_ = static_cast<float*>(Alloc(held * sizeof(float)));
  norm_partials_ = static_cast<float*>(Alloc(launch::kGradNormBlocks * sizeof(float)));
  norm_out_ = static_cast<float*>(Alloc(kNumParamTensors * sizeof(float)));
  param_blocks_ = {params_, grads_, master_, m_, v_, norm_partials_, norm_out_};
  if (!whole_range()) {
    staging_ = static_cast<float*>(Alloc(kStagingFloats * sizeof(float)));
    param_blocks_.push_back(staging_);
  }
}

void GptCuda::ForEachSpan(size_t lo, size_t hi,
                          const std::function<void(int, size_t, size_t, size_t)>& fn) const {
  ForEachDeviceSpan(layout_, table_, lo, hi, fn);
}

void GptCuda::UploadParams(const float* host_table) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(params_, 0, layout_.total * sizeof(bf16), stream_));
  float* staging = whole_range() ? master_ : staging_;
  const size_t piece = whole_range() ? std::max<size_t>(num_params_, 1) : kStagingFloats;
  for (size_t lo = 0; lo < num_params_; lo += piece) {
    const size_t n = std::min(piece, num_params_ - lo);
    // A pageable source: the copy has read it when the call returns.
    LOOM_CUDA_CHECK(cudaMemcpyAsync(staging, host_table + lo, n * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
    ForEachSpan(lo, lo + n, [&](int, size_t dev, size_t table, size_t count) {
      kc::cast_f32_to_bf16(params_ + dev, staging + (table - lo), static_cast<long>(count),
                           stream_);
    });
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

GptCuda::~GptCuda() {
  // Everything queued must be done before the memory goes back and the handles are destroyed.
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  FreeActivations();
  for (void* p : param_blocks_) allocator_->Free(p);
  allocator_.reset();
  memory_.reset();
  gemm_.reset();
  LOOM_CUDA_CHECK(cudaStreamDestroy(stream_));
}

void* GptCuda::Alloc(size_t bytes) { return allocator_->Allocate(bytes, ToStreamId(stream_)); }

void GptCuda::FreeActivations() {
  for (void* p : act_blocks_) allocator_->Free(p);
  act_blocks_.clear();
  a_ = Acts{};
  slot_acts_.clear();
  s_ = Grads{};
  B_ = T_ = 0;
  dlosses_value_ = -1.0f;
  have_input_grad_ = false;
}

GptCuda::Tensors GptCuda::View(bf16* base) const {
  Tensors t;
  bf16** fields[kNumParamTensors] = {&t.wte,      &t.wpe,      &t.ln1w, &t.ln1b, &t.qkvw, &t.qkvb,
                                     &t.attprojw, &t.attprojb, &t.ln2w, &t.ln2b, &t.fcw,  &t.fcb,
                                     &t.fcprojw,  &t.fcprojb,  &t.lnfw, &t.lnfb};
  for (int i = 0; i < kNumParamTensors; ++i) *fields[i] = base + layout_.offset[i];
  return t;
}

void GptCuda::InitWeights(uint64_t seed) {
  // The CPU model's initialisation, bit for bit, then the padded device layout.
  std::vector<float> host(num_params_);
  InitParams(host.data(), table_, dims_.layers, seed);
  LoadState(host.data(), nullptr, nullptr);
}

void GptCuda::Reserve(int B, int T, int slots) {
  LOOM_CHECK(B >= 1, "batch size must be >= 1");
  LOOM_CHECK(T >= 1 && T <= dims_.max_seq_len, "sequence length must be in [1, maxT]");
  LOOM_CHECK(slots >= 1, "a stage needs at least one activation slot");
  if (B == B_ && T == T_ && slots == static_cast<int>(slot_acts_.size())) return;
  FreeActivations();
  const size_t L = blocks_, C = dims_.channels, NHl = heads_local_, Vp = layout_.padded_vocab;
  const size_t Cl = qkv_local_, Fl = mlp_local_;
  const size_t N = static_cast<size_t>(B) * T;
  const bool first = first_stage(), last = last_stage();
  auto bf = [this](size_t n) {
    void* p = Alloc(n * sizeof(bf16));
    act_blocks_.push_back(p);
    return static_cast<bf16*>(p);
  };
  auto f32 = [this](size_t n) {
    void* p = Alloc(n * sizeof(float));
    act_blocks_.push_back(p);
    return static_cast<float*>(p);
  };
  auto i32 = [this](size_t n) {
    void* p = Alloc(n * sizeof(int));
    act_blocks_.push_back(p);
    return static_cast<int*>(p);
  };
  // Slot 0 first, in the order of one slot's layout (the planner's memory model replays the
  // whole model's order: server/planner/cuda_backend_memory.cc).
  for (int slot = 0; slot < slots; ++slot) {
    Acts x{};
    x.encoded = bf(N * C);
    x.ln1 = bf(L * N * C);
    x.ln1_mean = f32(L * N);
    x.ln1_rstd = f32(L * N);
    x.qkv = bf(L * N * 3 * Cl);
    x.atty = bf(L * N * Cl);
    if (flash_) {
      x.att_lse = f32(L * B * NHl * T);
    } else {
      x.att = bf(L * B * NHl * T * T);
    }
    x.residual2 = bf(L * N * C);
    x.ln2 = bf(L * N * C);
    x.ln2_mean = f32(L * N);
    x.ln2_rstd = f32(L * N);
    x.fch = bf(L * N * Fl);
    x.fch_gelu = bf(L * N * Fl);
    x.residual3 = bf(L * N * C);
    // One forward-only buffer for every slot.
    x.proj = slot == 0 ? bf(N * C) : slot_acts_[0].proj;
    if (last) {
      x.lnf = bf(N * C);
      x.lnf_mean = f32(N);
      x.lnf_rstd = f32(N);
      x.logits = bf(N * Vp);
      x.lse = f32(N);
      x.losses = f32(N);
    }
    if (first) x.tokens = i32(N);
    if (last) x.targets = i32(N);
    slot_acts_.push_back(x);
  }
  a_ = slot_acts_[0];

  if (last) {
    s_.dlosses = f32(N);
    s_.dlogits = bf(N * Vp);
  }
  s_.dresidual = bf(N * C);
  s_.dln = bf(N * C);
  s_.datty = bf(N * Cl);
  s_.dqkv = bf(N * 3 * Cl);
  s_.dfch_gelu = bf(N * Fl);
  s_.dfch = bf(N * Fl);
  s_.ln_scratch = f32(static_cast<size_t>(
      launch::LayerNormBackwardScratchFloats(static_cast<long>(N), static_cast<long>(C))));
  s_.att_scratch = Alloc(flash_ ? launch::FlashAttentionScratchBytes(B, T, static_cast<long>(NHl))
                                : launch::AttentionScratchBytes(T, static_cast<long>(NHl)));
  act_blocks_.push_back(s_.att_scratch);

  host_losses_.assign(N, 0.0f);
  B_ = B;
  T_ = T;
}

void GptCuda::UseSlot(int slot) {
  LOOM_CHECK(slot >= 0 && slot < static_cast<int>(slot_acts_.size()),
             "activation slot out of [0, slots)");
  a_ = slot_acts_[slot];
}

GptCuda::bf16* GptCuda::BlockInput(int l) const {
  const size_t NC = static_cast<size_t>(B_) * T_ * dims_.channels;
  return l == 0 ? a_.encoded : a_.residual3 + static_cast<size_t>(l - 1) * NC;
}

const GptCuda::bf16* GptCuda::Output(int slot) const {
  LOOM_CHECK(slot >= 0 && slot < static_cast<int>(slot_acts_.size()),
             "activation slot out of [0, slots)");
  const size_t NC = static_cast<size_t>(B_) * T_ * dims_.channels;
  return slot_acts_[slot].residual3 + static_cast<size_t>(blocks_ - 1) * NC;
}

void GptCuda::TpAllReduce(bf16* buf, size_t n) {
  if (tp_ == nullptr) return;
  // Issued behind the stream's work so far; the stream waits for the sum on the device. A
  // failed or hung collective aborts the communicator, and the step's next host wait on a
  // collective throws CommError.
  tp_->AllReduceSum(buf, n, DeviceDType::kBFloat16);
  tp_->StreamWaitAll(stream_);
}

void GptCuda::Forward(const int* tokens, const int* targets, int slot) {
  LOOM_CHECK(first_stage() && last_stage(), "Forward needs the whole model (one stage)");
  LOOM_CHECK(targets != nullptr, "Forward needs targets");
  ForwardMicro(slot, tokens, nullptr, targets);
}

void GptCuda::ForwardMicro(int slot, const int* tokens, const bf16* input, const int* targets) {
  LOOM_CHECK(B_ > 0, "call Reserve before ForwardMicro");
  UseSlot(slot);
  const int N = B_ * T_, V = dims_.vocab;
  const bool first = first_stage(), last = last_stage();
  LOOM_CHECK(first ? tokens != nullptr : input != nullptr,
             first ? "the first stage needs tokens" : "a later stage needs its input");
  LOOM_CHECK(!last || targets != nullptr, "the last stage needs targets on the GPU");
  // The kernels do not check ids on the device; the CPU model checks them here too.
  for (int i = 0; i < N; ++i) {
    if (first) LOOM_CHECK(tokens[i] >= 0 && tokens[i] < V, "input token id out of [0, V)");
    if (last) LOOM_CHECK(targets[i] >= 0 && targets[i] < V, "target id out of [0, V)");
  }

  // The stage pass's ops (stage_pass.h) on the CUDA kernels and the model's stream.
  struct Ops {
    GptCuda& m;
    const int* tokens;
    const bf16* input;
    const int* targets;
    const Tensors w = m.View(m.params_);
    const int B = m.B_, T = m.T_, C = m.dims_.channels, N = B * T;
    ::loom::train::Lap watch{};

    void Embed() {
      // Pageable copies: each returns once the host buffer has been read.
      LOOM_CUDA_CHECK(cudaMemcpyAsync(m.a_.tokens, tokens, static_cast<size_t>(N) * sizeof(int),
                                      cudaMemcpyHostToDevice, m.stream_));
      kc::encoder_forward(m.a_.encoded, m.a_.tokens, w.wte, w.wpe, B, T, C, m.stream_);
    }
    void TakeInput() {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(m.a_.encoded, input,
                                      static_cast<size_t>(N) * C * sizeof(bf16),
                                      cudaMemcpyDeviceToDevice, m.stream_));
    }
    void Block(int l) { m.BlockForward(l, w); }
    void Head() {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(m.a_.targets, targets, static_cast<size_t>(N) * sizeof(int),
                                      cudaMemcpyHostToDevice, m.stream_));
      const bf16* out = m.BlockInput(m.blocks_);  // residual3 of the last block (B, T, C)
      kc::layernorm_forward(m.a_.lnf, m.a_.lnf_mean, m.a_.lnf_rstd, out, w.lnfw, w.lnfb, N, C,
                            m.stream_);
      // (N, Vp), tied embedding: wte's padding rows are 0, and the padded columns are never read.
      const int Vp = m.layout_.padded_vocab;
      kc::matmul_forward(*m.gemm_, m.a_.logits, m.a_.lnf, w.wte, nullptr, N, C, Vp, m.stream_);
      kc::softmax_crossentropy_forward(m.a_.losses, m.a_.lse, m.a_.logits, m.a_.targets, N,
                                       m.dims_.vocab, Vp, m.stream_);
    }
    double Lap() { return m.DeviceLap(watch); }
  } ops{*this, tokens, input, targets};
  StageForwardPass(ops, stage_shape(), costs_);
}

StageShape GptCuda::stage_shape() const {
  return StageShape{first_stage(), last_stage(), shard_.first_block, blocks_, dims_.layers};
}

double GptCuda::DeviceLap(Lap& lap) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return lap();
}

// The block pass's ops (block_pass.h) on the CUDA kernels and the model's stream, at (B_, T_).
struct GptCuda::BlockOps {
  GptCuda& m;
  int B = m.B_, T = m.T_, N = B * T, C = m.dims_.channels;

  BlockShape Shape() const {
    return BlockShape{static_cast<size_t>(N), static_cast<size_t>(C),
                      static_cast<size_t>(m.qkv_local_), static_cast<size_t>(m.mlp_local_)};
  }
  size_t BHT() const { return static_cast<size_t>(B) * m.heads_local_ * T; }
  void LayerNorm(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                 const bf16* b) {
    kc::layernorm_forward(out, mean, rstd, inp, w, b, N, C, m.stream_);
  }
  void Linear(bf16* out, const bf16* inp, const bf16* w, const bf16* b, size_t in, size_t out_ch) {
    kc::matmul_forward(*m.gemm_, out, inp, w, b, N, static_cast<int>(in), static_cast<int>(out_ch),
                       m.stream_);
  }
  void LinearGelu(bf16* out, bf16* pre, const bf16* inp, const bf16* w, const bf16* b, size_t in,
                  size_t out_ch) {
    kc::matmul_gelu_forward(*m.gemm_, out, pre, inp, w, b, N, static_cast<int>(in),
                            static_cast<int>(out_ch), m.stream_);
  }
  void Attention(int l, bf16* out, const bf16* qkv) {
    const size_t sl = static_cast<size_t>(l);
    if (m.flash_) {
      kc::flash_attention_forward(out, m.a_.att_lse + sl * BHT(), qkv, B, T, m.qkv_local_,
                                  m.heads_local_, m.stream_);
    } else {
      kc::attention_forward(*m.gemm_, out, m.a_.att + sl * BHT() * T, m.s_.att_scratch, qkv, B, T,
                            m.qkv_local_, m.heads_local_, m.stream_);  // att (B, NH/tp, T, T)
    }
  }
  // A partial sum per tp rank; tp rank 0 adds the bias inside its GEMM, so the sum has it once.
  void RowParallel(bf16* out, const bf16* inp, const bf16* w, const bf16* b, size_t in) {
    const bool bias_here = m.tp_ == nullptr || m.shard_.tp_rank == 0;
    kc::matmul_forward(*m.gemm_, out, inp, w, bias_here ? b : nullptr, N, static_cast<int>(in), C,
                       m.stream_);
    m.TpAllReduce(out, static_cast<size_t>(N) * C);
  }
  void ResidualLayerNorm(bf16* res, bf16* out, float* mean, float* rstd, const bf16* x,
                         const bf16* y, const bf16* w, const bf16* b) {
    kc::residual_layernorm_forward(res, out, mean, rstd, x, y, w, b, N, C, m.stream_);
  }
  void Residual(bf16* out, const bf16* x, const bf16* y) {
    kc::residual_forward(out, x, y, static_cast<long>(N) * C, m.stream_);
  }
  void Zero(bf16* buf, size_t n) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(buf, 0, n * sizeof(bf16), m.stream_));
  }
  void LinearBackward(bf16* dinp, bf16* dw, bf16* db, const bf16* dout, const bf16* inp,
                      const bf16* w, size_t in, size_t out_ch) {
    kc::matmul_backward(*m.gemm_, dinp, dw, db, dout, inp, w, N, static_cast<int>(in),
                        static_cast<int>(out_ch), m.stream_);
  }
  void GeluBackward(bf16* dinp, const bf16* pre, const bf16* dout, size_t n) {
    kc::gelu_backward(dinp, pre, dout, static_cast<long>(n), m.stream_);
  }
  void AttentionBackward(int l, bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out) {
    const size_t sl = static_cast<size_t>(l);
    if (m.flash_) {
      kc::flash_attention_backward(dqkv, m.s_.att_scratch, dout, out, qkv,
                                   m.a_.att_lse + sl * BHT(), B, T, m.qkv_local_, m.heads_local_,
                                   m.stream_);
    } else {
      kc::attention_backward(*m.gemm_, dqkv, m.s_.att_scratch, dout, qkv, m.a_.att + sl * BHT() * T,
                             B, T, m.qkv_local_, m.heads_local_,
                             m.stream_);  // att (B, NH/tp, T, T)
    }
  }
  void TpAllReduce(bf16* buf, size_t n) { m.TpAllReduce(buf, n); }
  void LayerNormBackward(bf16* dinp, bf16* dw, bf16* db, const bf16* dout, const bf16* inp,
                         const bf16* w, const float* mean, const float* rstd) {
    kc::layernorm_backward(dinp, dw, db, m.s_.ln_scratch, dout, inp, w, mean, rstd, N, C,
                           m.stream_);
  }
};

// Local block l's tensors (stacked along the stage's blocks; this rank's tp slices) in a
// parameter-shaped buffer's view.
BlockTensors<GptCuda::bf16> GptCuda::BlockOf(const Tensors& t, size_t l) const {
  const size_t C = dims_.channels, Cl = qkv_local_, Fl = mlp_local_;
  return BlockTensors<bf16>{t.ln1w + l * C,      t.ln1b + l * C,          t.qkvw + l * 3 * Cl * C,
                            t.qkvb + l * 3 * Cl, t.attprojw + l * C * Cl, t.attprojb + l * C,
                            t.ln2w + l * C,      t.ln2b + l * C,          t.fcw + l * Fl * C,
                            t.fcb + l * Fl,      t.fcprojw + l * C * Fl,  t.fcprojb + l * C};
}

// Local block l's activations in the current slot; both projections go to the shared proj.
BlockActs<GptCuda::bf16> GptCuda::BlockActOf(size_t l) const {
  const size_t N = static_cast<size_t>(B_) * T_, C = dims_.channels, Cl = qkv_local_,
               Fl = mlp_local_;
  return BlockActs<bf16>{a_.ln1 + l * N * C,
                         a_.ln1_mean + l * N,
                         a_.ln1_rstd + l * N,
                         a_.qkv + l * N * 3 * Cl,
                         a_.atty + l * N * Cl,
                         a_.proj,
                         a_.residual2 + l * N * C,
                         a_.ln2 + l * N * C,
                         a_.ln2_mean + l * N,
                         a_.ln2_rstd + l * N,
                         a_.fch + l * N * Fl,
                         a_.fch_gelu + l * N * Fl,
                         a_.proj,
                         a_.residual3 + l * N * C};
}

void GptCuda::BlockForward(int l, const Tensors& w) {
  BlockOps ops{*this};
  const size_t sl = static_cast<size_t>(l);
  BlockForwardPass(ops, l, ops.Shape(), BlockOf(w, sl), BlockActOf(sl), BlockInput(l));
}

double GptCuda::LossSum(int slot) {
  LOOM_CHECK(B_ > 0 && last_stage(), "LossSum needs Reserve and a forward on the last stage");
  UseSlot(slot);
  const size_t N = static_cast<size_t>(B_) * T_;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host_losses_.data(), a_.losses, N * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  double sum = 0.0;  // in double, as the CPU model
  for (size_t i = 0; i < N; ++i) sum += host_losses_[i];
  return sum;
}

void GptCuda::ZeroGrad() {
  LOOM_CUDA_CHECK(cudaMemsetAsync(grads_, 0, layout_.total * sizeof(bf16), stream_));
}

void GptCuda::Backward(float loss_scale, const GradReadyFn& ready, int slot) {
  LOOM_CHECK(first_stage() && last_stage(), "Backward needs the whole model (one stage)");
  BackwardMicro(slot, loss_scale, nullptr, ready);
}

void GptCuda::BackwardMicro(int slot, float loss_scale, const bf16* doutput,
                            const GradReadyFn& ready) {
  LOOM_CHECK(B_ > 0, "call Reserve and ForwardMicro before BackwardMicro");
  UseSlot(slot);
  LOOM_CHECK(last_stage() || doutput != nullptr,
             "a stage before the last needs d(output) from the next one");

  // The stage pass's ops (stage_pass.h) on the CUDA kernels and the model's stream. `ready`
  // hears of a stage once its kernels are enqueued, so work it enqueues on this stream runs
  // after them.
  struct Ops {
    GptCuda& m;
    float loss_scale;
    const bf16* doutput;
    const Tensors w = m.View(m.params_);
    const Tensors g = m.View(m.grads_);
    const int B = m.B_, T = m.T_, C = m.dims_.channels, N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    ::loom::train::Lap watch{};

    // The backward ops accumulate, so each scratch buffer is zeroed before it is written.
    void Zero(bf16* buf, size_t n) {
      LOOM_CUDA_CHECK(cudaMemsetAsync(buf, 0, n * sizeof(bf16), m.stream_));
    }
    void HeadBackward() {
      const Grads& s = m.s_;
      // Loss = loss_scale * mean over N positions: each position's loss has weight loss_scale/N.
      const float dloss = loss_scale / static_cast<float>(N);
      if (dloss != m.dlosses_value_) {
        const std::vector<float> host(static_cast<size_t>(N), dloss);
        LOOM_CUDA_CHECK(cudaMemcpyAsync(s.dlosses, host.data(), host.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, m.stream_));
        LOOM_CUDA_CHECK(cudaStreamSynchronize(m.stream_));  // `host` is about to go away
        m.dlosses_value_ = dloss;
      }
      const int Vp = m.layout_.padded_vocab;
      // dlogits' padded columns stay 0, so wte's padding rows get a zero gradient.
      Zero(s.dlogits, static_cast<size_t>(N) * Vp);
      kc::softmax_crossentropy_backward(s.dlogits, m.a_.logits, m.a_.lse, m.a_.targets, s.dlosses,
                                        N, m.dims_.vocab, Vp, m.stream_);
      Zero(s.dln, NC);
      kc::matmul_backward(*m.gemm_, s.dln, g.wte, nullptr, s.dlogits, m.a_.lnf, w.wte, N, C, Vp,
                          m.stream_);
      Zero(s.dresidual, NC);
      kc::layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.ln_scratch, s.dln,
                             m.BlockInput(m.blocks_), w.lnfw, m.a_.lnf_mean, m.a_.lnf_rstd, N, C,
                             m.stream_);
    }
    void TakeOutputGrad() {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(m.s_.dresidual, doutput, NC * sizeof(bf16),
                                      cudaMemcpyDeviceToDevice, m.stream_));
    }
    void BlockBackward(int l) { m.BlockBackward(l, w, g); }
    void EmbedBackward() {
      kc::encoder_backward(g.wte, g.wpe, m.s_.dresidual, m.a_.tokens, B, T, C, m.stream_);
    }
    double Lap() { return m.DeviceLap(watch); }
  } ops{*this, loss_scale, doutput};
  StageBackwardPass(ops, stage_shape(), costs_, ready);
  have_input_grad_ = true;
}

const GptCuda::bf16* GptCuda::InputGrad() const {
  LOOM_CHECK(have_input_grad_, "InputGrad needs a BackwardMicro first");
  return s_.dresidual;
}

void GptCuda::BlockBackward(int l, const Tensors& w, const Tensors& g) {
  BlockOps ops{*this};
  const size_t sl = static_cast<size_t>(l);
  BlockBackwardPass(
      ops, l, ops.Shape(), BlockOf(w, sl), BlockOf(g, sl), BlockActOf(sl), BlockInput(l),
      BlockScratch<bf16>{s_.dresidual, s_.dln, s_.datty, s_.dqkv, s_.dfch, s_.dfch_gelu});
}

double GptCuda::GradNorm() {
  // One call over the whole buffer: wte's padding rows hold zeros and add nothing.
  kc::sum_of_squares(norm_out_, norm_partials_, grads_, static_cast<long>(layout_.total),
                     stream_);
  float sumsq = 0.0f;
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(&sumsq, norm_out_, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return std::sqrt(static_cast<double>(std::max(sumsq, 0.0f)));
}

void GptCuda::OwnedSumSquares(double* parts) {
  // One sum per owned tensor's span of the range (at most one each: the range is contiguous;
  // the padding rows of wte lie outside every span), then one copy back.
  float sums[kNumParamTensors] = {};
  bool summed[kNumParamTensors] = {};
  ForEachSpan(range_.begin, range_.end, [&](int i, size_t dev, size_t, size_t n) {
    if (!table_[i].owner) return;
    kc::sum_of_squares(norm_out_ + i, norm_partials_, grads_ + dev, static_cast<long>(n), stream_);
    summed[i] = true;
  });
  LOOM_CUDA_CHECK(cudaMemcpyAsync(sums, norm_out_, sizeof(sums), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (int i = 0; i < kNumParamTensors; ++i) {
    if (summed[i]) {
      parts[GradNormPart(dims_.layers, table_[i].name, shard_.first_block)] +=
          static_cast<double>(sums[i]);
    }
  }
}

void GptCuda::Update(const AdamWConfig& config, float lr, float grad_scale, int64_t t) {
  LOOM_CHECK(t >= 1, "the AdamW step is 1-based");
  // The range's span of each tensor (wte's padding rows are outside: they stay zero).
  ForEachSpan(range_.begin, range_.end, [&](int i, size_t dev, size_t table, size_t n) {
    const size_t local = table - range_.begin;
    // Weight decay on matrices only (TensorInfo::decay), as the CPU optimizer.
    const float decay = table_[i].decay ? config.weight_decay : 0.0f;
    kc::adamw_update(master_ + local, params_ + dev, grads_ + dev, m_ + local, v_ + local,
                     static_cast<long>(n), lr, config.beta1, config.beta2, config.eps, decay,
                     static_cast<int>(t), grad_scale, stream_);
  });
}

std::vector<float> GptCuda::ParamsToHost() {
  LOOM_CHECK(whole_range(), "ParamsToHost needs every master weight on this rank (no ZeRO-1)");
  return StateToHost().params;
}

}  // namespace loom::train
