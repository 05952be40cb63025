#include "worker/train/model/gpt.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/error.h"
#include "worker/train/model/stage_pass.h"

namespace loom::train {

namespace k = loom::kernels::cpu;

namespace {

// Hands out consecutive slices of one buffer: the first pass (base == nullptr) only counts,
// the second assigns pointers. Keeps the layout written once.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* Take(size_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += n;
    return p;
  }
  size_t used() const { return used_; }

 private:
  float* base_;
  size_t used_ = 0;
};

// This stage's sizes, for laying out its buffers.
struct StageDims {
  size_t Lb;   // blocks
  size_t C;    // channels
  size_t Cl;   // channels of each of q, k, v on this rank
  size_t NHl;  // heads on this rank
  size_t Fl;   // MLP width on this rank
  size_t V;    // vocabulary
  bool last;   // holds the final layernorm, the head and the loss
};

size_t LayoutActivations(Activations* a, float* base, const StageDims& d, int B, int T) {
  const size_t L = d.Lb, C = d.C, Cl = d.Cl, NH = d.NHl, F = d.Fl, V = d.V;
  const size_t N = static_cast<size_t>(B) * T;
  Carver c(base);
  a->encoded = c.Take(N * C);
  a->ln1 = c.Take(L * N * C);
  a->ln1_mean = c.Take(L * N);
  a->ln1_rstd = c.Take(L * N);
  a->qkv = c.Take(L * N * 3 * Cl);
  a->atty = c.Take(L * N * Cl);
  a->att = c.Take(L * B * NH * T * T);
  a->attproj = c.Take(L * N * C);
  a->residual2 = c.Take(L * N * C);
  a->ln2 = c.Take(L * N * C);
  a->ln2_mean = c.Take(L * N);
  a->ln2_rstd = c.Take(L * N);
  a->fch = c.Take(L * N * F);
  a->fch_gelu = c.Take(L * N * F);
  a->fcproj = c.Take(L * N * C);
  a->residual3 = c.Take(L * N * C);
  const bool last = d.last;
  a->lnf = last ? c.Take(N * C) : nullptr;
  a->lnf_mean = last ? c.Take(N) : nullptr;
  a->lnf_rstd = last ? c.Take(N) : nullptr;
  a->logits = last ? c.Take(N * V) : nullptr;
  a->probs = last ? c.Take(N * V) : nullptr;
  a->losses = last ? c.Take(N) : nullptr;
  return c.used();
}

size_t LayoutScratch(BackwardScratch* s, float* base, const StageDims& d, int B, int T) {
  const size_t C = d.C, Cl = d.Cl, NH = d.NHl, F = d.Fl, V = d.V;
  const size_t N = static_cast<size_t>(B) * T;
  Carver c(base);
  s->dlosses = d.last ? c.Take(N) : nullptr;
  s->dlogits = d.last ? c.Take(N * V) : nullptr;
  s->dresidual = c.Take(N * C);
  s->dln = c.Take(N * C);
  s->datty = c.Take(N * Cl);
  s->dqkv = c.Take(N * 3 * Cl);
  s->dfch = c.Take(N * F);
  s->dfch_gelu = c.Take(N * F);
  s->datt = c.Take(static_cast<size_t>(B) * NH * T * T);
  return c.used();
}

StageDims StageDimsOf(const ModelDims& dims, int blocks, int qkv_local, int heads_local,
                      int mlp_local, bool last) {
  return StageDims{static_cast<size_t>(blocks),
                   static_cast<size_t>(dims.channels),
                   static_cast<size_t>(qkv_local),
                   static_cast<size_t>(heads_local),
                   static_cast<size_t>(mlp_local),
                   static_cast<size_t>(dims.vocab),
                   last};
}

}  // namespace

GPT::GPT(const ModelDims& dims, const ModelShard& shard, Communicator* tp)
    : dims_(dims), shard_(shard) {
  LOOM_CHECK(DimsProblem(dims).empty(), "invalid model dimensions: " + DimsProblem(dims));
  const std::string problem = ShardProblem(dims, shard);
  LOOM_CHECK(problem.empty(), "invalid model shard: " + problem);
  if (shard_.last_block == -1) shard_.last_block = dims.layers;
  if (shard_.tp_size > 1) {
    LOOM_CHECK(tp != nullptr && tp->size() == shard_.tp_size && tp->rank() == shard_.tp_rank,
               "tensor parallelism needs the tp group's communicator (size tp_size, rank "
               "tp_rank)");
    tp_ = tp;
  }
  table_ = ShardTable(dims, shard_);
  blocks_ = shard_.last_block - shard_.first_block;
  heads_local_ = dims.heads / shard_.tp_size;
  qkv_local_ = dims.channels / shard_.tp_size;
  mlp_local_ = 4 * dims.channels / shard_.tp_size;
  params_.resize(ParamCount(table_));
}

void GPT::InitWeights(uint64_t seed) { InitParams(params_.data(), table_, dims_.layers, seed); }

void GPT::Reserve(int B, int T, int slots) {
  LOOM_CHECK(B >= 1, "batch size must be >= 1");
  LOOM_CHECK(T >= 1 && T <= dims_.max_seq_len, "sequence length must be in [1, maxT]");
  LOOM_CHECK(slots >= 1, "a stage needs at least one activation slot");
  if (B == B_ && T == T_ && slots == slots_) return;
  const StageDims d =
      StageDimsOf(dims_, blocks_, qkv_local_, heads_local_, mlp_local_, last_stage());
  Activations layout{};
  const size_t per_slot = LayoutActivations(&layout, nullptr, d, B, T);
  // A fresh vector, not assign: shrinking must give the memory back (bytes_allocated counts
  // capacity).
  std::vector<float>(per_slot * slots).swap(act_memory_);
  acts_.assign(slots, Activations{});
  for (int i = 0; i < slots; ++i) {
    LayoutActivations(&acts_[i], act_memory_.data() + i * per_slot, d, B, T);
  }
  std::vector<float>().swap(scratch_memory_);  // re-laid-out on the next backward
  const size_t N = static_cast<size_t>(B) * T;
  std::vector<int>(first_stage() ? slots * N : 0).swap(inputs_);
  std::vector<int>(last_stage() ? slots * N : 0).swap(targets_);
  have_targets_.assign(slots, false);
  last_forward_slot_ = 0;
  B_ = B;
  T_ = T;
  slots_ = slots;
}

float GPT::ForwardMicro(int slot, const int* tokens, const float* input, const int* targets) {
  LOOM_CHECK(slots_ > 0, "call Reserve before ForwardMicro");
  LOOM_CHECK(slot >= 0 && slot < slots_, "activation slot out of [0, slots)");
  const int N = B_ * T_, V = dims_.vocab;
  const bool first = first_stage(), last = last_stage();
  LOOM_CHECK(first ? tokens != nullptr : input != nullptr,
             first ? "the first stage needs tokens" : "a later stage needs its input");
  for (int i = 0; i < N; ++i) {
    if (first) LOOM_CHECK(tokens[i] >= 0 && tokens[i] < V, "input token id out of [0, V)");
    if (last && targets) LOOM_CHECK(targets[i] >= 0 && targets[i] < V, "target id out of [0, V)");
  }
  const bool with_targets = last && targets != nullptr;
  if (first) std::copy(tokens, tokens + N, inputs_.begin() + static_cast<size_t>(slot) * N);
  if (with_targets)
    std::copy(targets, targets + N, targets_.begin() + static_cast<size_t>(slot) * N);
  have_targets_[slot] = with_targets;
  last_forward_slot_ = slot;

  // The stage pass's ops (stage_pass.h) on the CPU kernels, for this micro-batch.
  struct Ops {
    GPT& m;
    int slot;
    const int* tokens;
    const float* input;
    const int* targets;
    const Activations& a = m.acts_[slot];
    const int B = m.B_, T = m.T_, C = m.dims_.channels, V = m.dims_.vocab, N = B * T;
    double sum = 0.0;  // the losses' sum, in double so the mean does not depend on N's rounding
    ::loom::train::Lap watch{};

    void Embed() {
      ParamTensors p = ViewParams(m.params_.data(), m.table_);
      k::encoder_forward(a.encoded, tokens, p.wte, p.wpe, B, T, C);  // (B, T, C)
    }
    void TakeInput() { std::memcpy(a.encoded, input, static_cast<size_t>(N) * C * sizeof(float)); }
    void Block(int l) { m.BlockForward(l, a, B, T); }
    void Head() {
      ParamTensors p = ViewParams(m.params_.data(), m.table_);
      k::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, m.Output(slot), p.lnfw, p.lnfb, N, C);
      k::matmul_forward(a.logits, a.lnf, p.wte, nullptr, N, C, V);  // (N, V), tied embedding
      if (targets == nullptr) return;
      k::softmax_crossentropy_forward(a.losses, a.probs, a.logits, targets, N, V);
      for (int i = 0; i < N; ++i) sum += a.losses[i];
    }
    double Lap() { return watch(); }
  } ops{*this, slot, tokens, input, with_targets ? targets : nullptr};
  StageForwardPass(ops, stage_shape(), costs_);
  return with_targets ? static_cast<float>(ops.sum / N) : 0.0f;
}

StageShape GPT::stage_shape() const {
  return StageShape{first_stage(), last_stage(), shard_.first_block, blocks_, dims_.layers};
}

const float* GPT::Output(int slot) const {
  LOOM_CHECK(slot >= 0 && slot < slots_, "activation slot out of [0, slots)");
  const size_t NC = static_cast<size_t>(B_) * T_ * dims_.channels;
  return acts_[slot].residual3 + static_cast<size_t>(blocks_ - 1) * NC;
}

float GPT::Forward(const int* inputs, const int* targets, int B, int T) {
  LOOM_CHECK(first_stage() && last_stage(), "Forward needs the whole model (one stage)");
  Reserve(B, T, 1);
  return ForwardMicro(0, inputs, nullptr, targets);
}

void GPT::ZeroGrad() {
  if (grads_.size() != params_.size()) grads_.assign(params_.size(), 0.0f);
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void GPT::EnsureScratch() {
  if (!scratch_memory_.empty()) return;
  const StageDims d =
      StageDimsOf(dims_, blocks_, qkv_local_, heads_local_, mlp_local_, last_stage());
  std::vector<float>(LayoutScratch(&scratch_, nullptr, d, B_, T_)).swap(scratch_memory_);
  LayoutScratch(&scratch_, scratch_memory_.data(), d, B_, T_);
}

void GPT::BackwardMicro(int slot, float loss_scale, const float* doutput,
                        const std::function<void(int stage)>& ready) {
  LOOM_CHECK(slots_ > 0 && slot >= 0 && slot < slots_, "activation slot out of [0, slots)");
  LOOM_CHECK(grads_.size() == params_.size(), "call ZeroGrad before the first Backward");
  LOOM_CHECK(!last_stage() || have_targets_[slot], "Backward needs a Forward with targets first");
  LOOM_CHECK(last_stage() || doutput != nullptr,
             "a stage before the last needs d(output) from the next one");
  EnsureScratch();

  // The stage pass's ops (stage_pass.h) on the CPU kernels, for this micro-batch.
  struct Ops {
    GPT& m;
    int slot;
    float loss_scale;
    const float* doutput;
    const Activations& a = m.acts_[slot];
    const BackwardScratch& s = m.scratch_;
    const int B = m.B_, T = m.T_, C = m.dims_.channels, V = m.dims_.vocab, N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    ::loom::train::Lap watch{};

    // The backward kernels accumulate, so every scratch buffer is zeroed before it is written.
    static void Zero(float* buf, size_t n) { std::memset(buf, 0, n * sizeof(float)); }
    void HeadBackward() {
      ParamTensors p = ViewParams(m.params_.data(), m.table_);
      ParamTensors g = ViewParams(m.grads_.data(), m.table_);
      // Loss = loss_scale * mean over N positions: each position's loss has weight loss_scale/N.
      std::fill(s.dlosses, s.dlosses + N, loss_scale / static_cast<float>(N));
      Zero(s.dlogits, static_cast<size_t>(N) * V);
      const int* targets = m.targets_.data() + static_cast<size_t>(slot) * N;
      k::softmax_crossentropy_backward(s.dlogits, a.probs, targets, s.dlosses, N, V);
      Zero(s.dln, NC);
      k::matmul_backward(s.dln, g.wte, nullptr, s.dlogits, a.lnf, p.wte, N, C, V);
      Zero(s.dresidual, NC);
      k::layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.dln, m.Output(slot), p.lnfw, a.lnf_mean,
                            a.lnf_rstd, N, C);
    }
    void TakeOutputGrad() { std::memcpy(s.dresidual, doutput, NC * sizeof(float)); }
    void BlockBackward(int l) { m.BlockBackward(l, a, B, T); }
    void EmbedBackward() {
      ParamTensors g = ViewParams(m.grads_.data(), m.table_);
      const int* tokens = m.inputs_.data() + static_cast<size_t>(slot) * N;
      k::encoder_backward(g.wte, g.wpe, s.dresidual, tokens, B, T, C);
    }
    double Lap() { return watch(); }
  } ops{*this, slot, loss_scale, doutput};
  StageBackwardPass(ops, stage_shape(), costs_, ready);
}

const float* GPT::InputGrad() const {
  LOOM_CHECK(!scratch_memory_.empty(), "InputGrad needs a BackwardMicro first");
  return scratch_.dresidual;
}

void GPT::Backward(float loss_scale, const GradReadyFn& ready) {
  BackwardMicro(0, loss_scale, nullptr, ready);
}

const float* GPT::logits() const {
  return last_stage() && slots_ > 0 ? acts_[last_forward_slot_].logits : nullptr;
}

size_t GPT::bytes_allocated() const {
  return (params_.capacity() + grads_.capacity() + act_memory_.capacity() +
          scratch_memory_.capacity()) *
             sizeof(float) +
         (inputs_.capacity() + targets_.capacity()) * sizeof(int);
}

}  // namespace loom::train
