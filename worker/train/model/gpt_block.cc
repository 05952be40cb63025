// The CPU model's transformer block: the shared block pass (block_pass.h, the sequence and the
// tensor-parallel split, written once for both backends) over the fp32 CPU kernels of kernels/.
// With tp = 1 this is llm.c's block, kernel call for kernel call.
#include <cstring>

#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/model/block_pass.h"
#include "worker/train/model/gpt.h"

namespace loom::train {

namespace k = loom::kernels::cpu;

namespace {

BlockTensors<float> BlockOf(const ParamTensors& p, size_t l, const BlockShape& d) {
  const size_t C = d.C, Cl = d.Cl, Fl = d.Fl;
  return BlockTensors<float>{p.ln1w + l * C,      p.ln1b + l * C,          p.qkvw + l * 3 * Cl * C,
                             p.qkvb + l * 3 * Cl, p.attprojw + l * C * Cl, p.attprojb + l * C,
                             p.ln2w + l * C,      p.ln2b + l * C,          p.fcw + l * Fl * C,
                             p.fcb + l * Fl,      p.fcprojw + l * C * Fl,  p.fcprojb + l * C};
}

// One block's activations: the l-th slice of each stacked buffer.
BlockActs<float> BlockActOf(const Activations& a, size_t l, const BlockShape& d) {
  const size_t N = d.N, C = d.C, Cl = d.Cl, Fl = d.Fl;
  return BlockActs<float>{a.ln1 + l * N * C,       a.ln1_mean + l * N,     a.ln1_rstd + l * N,
                          a.qkv + l * N * 3 * Cl,  a.atty + l * N * Cl,    a.attproj + l * N * C,
                          a.residual2 + l * N * C, a.ln2 + l * N * C,      a.ln2_mean + l * N,
                          a.ln2_rstd + l * N,      a.fch + l * N * Fl,     a.fch_gelu + l * N * Fl,
                          a.fcproj + l * N * C,    a.residual3 + l * N * C};
}

}  // namespace

// The block pass's ops (block_pass.h) on the CPU kernels, at the model's (B, T).
struct GPT::BlockOps {
  GPT& m;
  const Activations& a;
  int B, T;
  int N = B * T, C = m.dims_.channels;

  float* Att(int l) const {
    return a.att + static_cast<size_t>(l) * B * m.heads_local_ * T * T;  // (B, NH/tp, T, T)
  }
  void LayerNorm(float* out, float* mean, float* rstd, const float* inp, const float* w,
                 const float* b) {
    k::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void Linear(float* out, const float* inp, const float* w, const float* b, size_t in,
              size_t out_ch) {
    k::matmul_forward(out, inp, w, b, N, static_cast<int>(in), static_cast<int>(out_ch));
  }
  void LinearGelu(float* out, float* pre, const float* inp, const float* w, const float* b,
                  size_t in, size_t out_ch) {
    Linear(pre, inp, w, b, in, out_ch);
    k::gelu_forward(out, pre, static_cast<long>(N) * static_cast<long>(out_ch));
  }
  void Attention(int l, float* out, const float* qkv) {
    k::attention_forward(out, Att(l), qkv, B, T, m.qkv_local_, m.heads_local_);
  }
  // Each rank's product is a partial sum over its `in` columns, so the bias is added once,
  // after the sum.
  void RowParallel(float* out, const float* inp, const float* w, const float* b, size_t in) {
    if (m.tp_ == nullptr) {
      k::matmul_forward(out, inp, w, b, N, static_cast<int>(in), C);
      return;
    }
    k::matmul_forward(out, inp, w, nullptr, N, static_cast<int>(in), C);
    m.TpAllReduce(out, static_cast<size_t>(N) * C);
    for (int n = 0; n < N; ++n) {
      float* row = out + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) row[c] += b[c];
    }
  }
  void ResidualLayerNorm(float* res, float* out, float* mean, float* rstd, const float* x,
                         const float* y, const float* w, const float* b) {
    Residual(res, x, y);
    LayerNorm(out, mean, rstd, res, w, b);
  }
  void Residual(float* out, const float* x, const float* y) {
    k::residual_forward(out, x, y, static_cast<long>(N) * C);
  }
  void Zero(float* buf, size_t n) { std::memset(buf, 0, n * sizeof(float)); }
  void LinearBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                      const float* w, size_t in, size_t out_ch) {
    k::matmul_backward(dinp, dw, db, dout, inp, w, N, static_cast<int>(in),
                       static_cast<int>(out_ch));
  }
  void GeluBackward(float* dinp, const float* pre, const float* dout, size_t n) {
    k::gelu_backward(dinp, pre, dout, static_cast<long>(n));
  }
  void AttentionBackward(int l, float* dqkv, const float* dout, const float* qkv, const float*) {
    k::attention_backward(dqkv, m.scratch_.datt, dout, qkv, Att(l), B, T, m.qkv_local_,
                          m.heads_local_);
  }
  void TpAllReduce(float* buf, size_t n) { m.TpAllReduce(buf, n); }
  void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                         const float* w, const float* mean, const float* rstd) {
    k::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
};

void GPT::TpAllReduce(float* buf, size_t n) {
  if (tp_ == nullptr) return;
  const int64_t start = trace_ != nullptr ? TraceRecorder::Now() : 0;
  tp_->AllReduceSum(buf, n)->Wait();
  if (trace_ != nullptr) {
    trace_->Since(TraceKind::kTpAllReduce, start, trace_->micro(), n * sizeof(float));
  }
}

const float* GPT::BlockInput(const Activations& a, int l) const {
  const size_t NC = static_cast<size_t>(B_) * T_ * dims_.channels;
  return l == 0 ? a.encoded : a.residual3 + static_cast<size_t>(l - 1) * NC;
}

void GPT::BlockForward(int l, const Activations& a, int B, int T) {
  const BlockShape d{static_cast<size_t>(B) * T, static_cast<size_t>(dims_.channels),
                     static_cast<size_t>(qkv_local_), static_cast<size_t>(mlp_local_)};
  BlockOps ops{*this, a, B, T};
  const size_t sl = static_cast<size_t>(l);
  BlockForwardPass(ops, l, d, BlockOf(ViewParams(params_.data(), table_), sl, d),
                   BlockActOf(a, sl, d), BlockInput(a, l));
}

void GPT::BlockBackward(int l, const Activations& a, int B, int T) {
  const BlockShape d{static_cast<size_t>(B) * T, static_cast<size_t>(dims_.channels),
                     static_cast<size_t>(qkv_local_), static_cast<size_t>(mlp_local_)};
  BlockOps ops{*this, a, B, T};
  const size_t sl = static_cast<size_t>(l);
  const BackwardScratch& s = scratch_;
  BlockBackwardPass(ops, l, d, BlockOf(ViewParams(params_.data(), table_), sl, d),
                    BlockOf(ViewParams(grads_.data(), table_), sl, d), BlockActOf(a, sl, d),
                    BlockInput(a, l),
                    BlockScratch<float>{s.dresidual, s.dln, s.datty, s.dqkv, s.dfch, s.dfch_gelu});
}

}  // namespace loom::train
