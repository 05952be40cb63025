#include "worker/train/model/gpt.h"

#include <algorithm>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "worker/train/error.h"

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

size_t LayoutActivations(Activations* a, float* base, const ModelDims& d, int B, int T) {
  const size_t L = d.layers, C = d.channels, NH = d.heads, V = d.vocab;
  const size_t N = static_cast<size_t>(B) * T;
  Carver c(base);
  a->encoded = c.Take(N * C);
  a->ln1 = c.Take(L * N * C);
  a->ln1_mean = c.Take(L * N);
  a->ln1_rstd = c.Take(L * N);
  a->qkv = c.Take(L * N * 3 * C);
  a->atty = c.Take(L * N * C);
  a->att = c.Take(L * B * NH * T * T);
  a->attproj = c.Take(L * N * C);
  a->residual2 = c.Take(L * N * C);
  a->ln2 = c.Take(L * N * C);
  a->ln2_mean = c.Take(L * N);
  a->ln2_rstd = c.Take(L * N);
  a->fch = c.Take(L * N * 4 * C);
  a->fch_gelu = c.Take(L * N * 4 * C);
  a->fcproj = c.Take(L * N * C);
  a->residual3 = c.Take(L * N * C);
  a->lnf = c.Take(N * C);
  a->lnf_mean = c.Take(N);
  a->lnf_rstd = c.Take(N);
  a->logits = c.Take(N * V);
  a->probs = c.Take(N * V);
  a->losses = c.Take(N);
  return c.used();
}

size_t LayoutScratch(BackwardScratch* s, float* base, const ModelDims& d, int B, int T) {
  const size_t C = d.channels, NH = d.heads, V = d.vocab;
  const size_t N = static_cast<size_t>(B) * T;
  Carver c(base);
  s->dlosses = c.Take(N);
  s->dlogits = c.Take(N * V);
  s->dresidual = c.Take(N * C);
  s->dln = c.Take(N * C);
  s->datty = c.Take(N * C);
  s->dqkv = c.Take(N * 3 * C);
  s->dfch = c.Take(N * 4 * C);
  s->dfch_gelu = c.Take(N * 4 * C);
  s->datt = c.Take(static_cast<size_t>(B) * NH * T * T);
  return c.used();
}

// One block's parameters (const views into a ParamTensors).
struct BlockParams {
  const float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
  const float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

BlockParams Block(const ParamTensors& p, size_t l, size_t C) {
  return BlockParams{p.ln1w + l * C,
                     p.ln1b + l * C,
                     p.qkvw + l * 3 * C * C,
                     p.qkvb + l * 3 * C,
                     p.attprojw + l * C * C,
                     p.attprojb + l * C,
                     p.ln2w + l * C,
                     p.ln2b + l * C,
                     p.fcw + l * 4 * C * C,
                     p.fcb + l * 4 * C,
                     p.fcprojw + l * 4 * C * C,
                     p.fcprojb + l * C};
}

// One block's gradient buffers (mutable views into a ParamTensors of gradients).
struct BlockGrads {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
  float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

BlockGrads BlockGrad(const ParamTensors& g, size_t l, size_t C) {
  return BlockGrads{g.ln1w + l * C,
                    g.ln1b + l * C,
                    g.qkvw + l * 3 * C * C,
                    g.qkvb + l * 3 * C,
                    g.attprojw + l * C * C,
                    g.attprojb + l * C,
                    g.ln2w + l * C,
                    g.ln2b + l * C,
                    g.fcw + l * 4 * C * C,
                    g.fcb + l * 4 * C,
                    g.fcprojw + l * 4 * C * C,
                    g.fcprojb + l * C};
}

// One block's activations, l-th slice of each stacked buffer.
struct BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2;
  float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3;
};

BlockActs BlockAct(const Activations& a, size_t l, size_t B, size_t T, size_t C, size_t NH) {
  const size_t N = B * T;
  return BlockActs{a.ln1 + l * N * C,          a.ln1_mean + l * N,      a.ln1_rstd + l * N,
                   a.qkv + l * N * 3 * C,      a.atty + l * N * C,      a.att + l * B * NH * T * T,
                   a.attproj + l * N * C,      a.residual2 + l * N * C, a.ln2 + l * N * C,
                   a.ln2_mean + l * N,         a.ln2_rstd + l * N,      a.fch + l * N * 4 * C,
                   a.fch_gelu + l * N * 4 * C, a.fcproj + l * N * C,    a.residual3 + l * N * C};
}

}  // namespace

GPT::GPT(const ModelDims& dims) : dims_(dims), table_(ParamTable(dims)) {
  LOOM_CHECK(DimsProblem(dims).empty(), "invalid model dimensions: " + DimsProblem(dims));
  params_.resize(ParamCount(table_));
}

void GPT::InitWeights(uint64_t seed) { InitParams(params_.data(), table_, dims_.layers, seed); }

void GPT::EnsureActivations(int B, int T) {
  LOOM_CHECK(B >= 1, "batch size must be >= 1");
  LOOM_CHECK(T >= 1 && T <= dims_.max_seq_len, "sequence length must be in [1, maxT]");
  if (B == B_ && T == T_) return;
  act_memory_.assign(LayoutActivations(&acts_, nullptr, dims_, B, T), 0.0f);
  LayoutActivations(&acts_, act_memory_.data(), dims_, B, T);
  scratch_memory_.clear();  // re-laid-out on the next Backward
  scratch_memory_.shrink_to_fit();
  inputs_.assign(static_cast<size_t>(B) * T, 0);
  targets_.assign(static_cast<size_t>(B) * T, 0);
  B_ = B;
  T_ = T;
}

float GPT::Forward(const int* inputs, const int* targets, int B, int T) {
  EnsureActivations(B, T);
  const int C = dims_.channels, NH = dims_.heads, V = dims_.vocab;
  const int N = B * T;
  for (int i = 0; i < N; ++i) {
    LOOM_CHECK(inputs[i] >= 0 && inputs[i] < V, "input token id out of [0, V)");
    if (targets) LOOM_CHECK(targets[i] >= 0 && targets[i] < V, "target id out of [0, V)");
  }
  std::copy(inputs, inputs + N, inputs_.begin());
  if (targets) std::copy(targets, targets + N, targets_.begin());
  have_targets_ = targets != nullptr;

  ParamTensors p = ViewParams(params_.data(), table_);
  const Activations& a = acts_;
  k::encoder_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);  // (B, T, C)
  for (int l = 0; l < dims_.layers; ++l) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + static_cast<size_t>(l - 1) * N * C;
    BlockParams w = Block(p, l, C);
    BlockActs x = BlockAct(a, l, B, T, C, NH);
    k::layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, N, C);
    k::matmul_forward(x.qkv, x.ln1, w.qkvw, w.qkvb, N, C, 3 * C);  // (N, 3C)
    k::attention_forward(x.atty, x.att, x.qkv, B, T, C, NH);       // (N, C)
    k::matmul_forward(x.attproj, x.atty, w.attprojw, w.attprojb, N, C, C);
    k::residual_forward(x.residual2, residual, x.attproj, static_cast<long>(N) * C);
    k::layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, N, C);
    k::matmul_forward(x.fch, x.ln2, w.fcw, w.fcb, N, C, 4 * C);  // (N, 4C)
    k::gelu_forward(x.fch_gelu, x.fch, static_cast<long>(N) * 4 * C);
    k::matmul_forward(x.fcproj, x.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);
    k::residual_forward(x.residual3, x.residual2, x.fcproj, static_cast<long>(N) * C);
  }
  const float* last = a.residual3 + static_cast<size_t>(dims_.layers - 1) * N * C;
  k::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, N, C);
  k::matmul_forward(a.logits, a.lnf, p.wte, nullptr, N, C, V);  // (N, V), tied embedding
  if (!targets) return 0.0f;
  k::softmax_crossentropy_forward(a.losses, a.probs, a.logits, targets, N, V);
  double sum = 0.0;  // in double so the mean does not depend on N's rounding
  for (int i = 0; i < N; ++i) sum += a.losses[i];
  return static_cast<float>(sum / N);
}

void GPT::ZeroGrad() {
  if (grads_.size() != params_.size()) grads_.assign(params_.size(), 0.0f);
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void GPT::Backward(float loss_scale, const GradReadyFn& ready) {
  LOOM_CHECK(have_targets_, "Backward needs a Forward with targets first");
  LOOM_CHECK(grads_.size() == params_.size(), "call ZeroGrad before the first Backward");
  const int B = B_, T = T_, C = dims_.channels, NH = dims_.heads, V = dims_.vocab;
  const int N = B * T;
  const long NC = static_cast<long>(N) * C;
  if (scratch_memory_.empty()) {
    scratch_memory_.assign(LayoutScratch(&scratch_, nullptr, dims_, B, T), 0.0f);
    LayoutScratch(&scratch_, scratch_memory_.data(), dims_, B, T);
  }
  ParamTensors p = ViewParams(params_.data(), table_);
  ParamTensors g = ViewParams(grads_.data(), table_);
  const Activations& a = acts_;
  const BackwardScratch& s = scratch_;
  // The backward kernels accumulate, so every scratch buffer is zeroed before it is written.
  auto zero = [](float* buf, size_t n) { std::memset(buf, 0, n * sizeof(float)); };

  // Loss = loss_scale * mean over N positions: each position's loss has weight loss_scale / N.
  std::fill(s.dlosses, s.dlosses + N, loss_scale / static_cast<float>(N));
  zero(s.dlogits, static_cast<size_t>(N) * V);
  k::softmax_crossentropy_backward(s.dlogits, a.probs, targets_.data(), s.dlosses, N, V);
  zero(s.dln, NC);
  k::matmul_backward(s.dln, g.wte, nullptr, s.dlogits, a.lnf, p.wte, N, C, V);
  const float* last = a.residual3 + static_cast<size_t>(dims_.layers - 1) * N * C;
  zero(s.dresidual, NC);
  k::layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.dln, last, p.lnfw, a.lnf_mean, a.lnf_rstd, N,
                        C);
  if (ready) ready(dims_.layers);

  // Down the blocks. On entry to block l, dresidual holds d(residual3 of block l). A residual
  // add passes its output gradient unchanged to both inputs, so dresidual is used directly as
  // the gradient of the branch output, and each branch's input gradient is added into it.
  for (int l = dims_.layers - 1; l >= 0; --l) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + static_cast<size_t>(l - 1) * N * C;
    BlockParams w = Block(p, l, C);
    BlockGrads dw = BlockGrad(g, l, C);
    BlockActs x = BlockAct(a, l, B, T, C, NH);
    // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    zero(s.dfch_gelu, 4 * NC);
    k::matmul_backward(s.dfch_gelu, dw.fcprojw, dw.fcprojb, s.dresidual, x.fch_gelu, w.fcprojw, N,
                       4 * C, C);
    zero(s.dfch, 4 * NC);
    k::gelu_backward(s.dfch, x.fch, s.dfch_gelu, 4 * NC);
    zero(s.dln, NC);
    k::matmul_backward(s.dln, dw.fcw, dw.fcb, s.dfch, x.ln2, w.fcw, N, C, 4 * C);
    k::layernorm_backward(s.dresidual, dw.ln2w, dw.ln2b, s.dln, x.residual2, w.ln2w, x.ln2_mean,
                          x.ln2_rstd, N, C);
    // dresidual now holds d(residual2). Attention branch: residual2 = residual + attn(ln1(...)).
    zero(s.datty, NC);
    k::matmul_backward(s.datty, dw.attprojw, dw.attprojb, s.dresidual, x.atty, w.attprojw, N, C, C);
    zero(s.dqkv, 3 * NC);
    k::attention_backward(s.dqkv, s.datt, s.datty, x.qkv, x.att, B, T, C, NH);
    zero(s.dln, NC);
    k::matmul_backward(s.dln, dw.qkvw, dw.qkvb, s.dqkv, x.ln1, w.qkvw, N, C, 3 * C);
    k::layernorm_backward(s.dresidual, dw.ln1w, dw.ln1b, s.dln, residual, w.ln1w, x.ln1_mean,
                          x.ln1_rstd, N, C);
    // dresidual now holds d(block input) = d(residual3 of block l-1).
    if (ready) ready(l);
  }
  k::encoder_backward(g.wte, g.wpe, s.dresidual, inputs_.data(), B, T, C);
  if (ready) ready(-1);
}

size_t GPT::bytes_allocated() const {
  return (params_.capacity() + grads_.capacity() + act_memory_.capacity() +
          scratch_memory_.capacity()) *
             sizeof(float) +
         (inputs_.capacity() + targets_.capacity()) * sizeof(int);
}

}  // namespace loom::train
