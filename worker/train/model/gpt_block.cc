// One transformer block of GPT, forward and backward, on this rank's tensor-parallel slice.
//
// Megatron's split (DESIGN.md, "TP"): qkvw and fcw are column-parallel (each rank computes its
// heads' q, k, v and its slice of the MLP from the replicated layernorm output), attprojw and
// fcprojw row-parallel (each rank's product is a partial sum over its input slice). So the
// forward pass all-reduces the two row-parallel outputs and the backward pass the two
// layernorm-output gradients of the column-parallel inputs: two all-reduces per block each way.
// Everything between (layernorms, residuals, biases of the row-parallel layers) is replicated
// and computed identically on every tp rank. With tp = 1 this is llm.c's block, kernel call for
// kernel call.
#include <cstring>

#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/model/gpt.h"

namespace loom::train {

namespace k = loom::kernels::cpu;

namespace {

// The sizes of one block on this rank.
struct BlockDims {
  size_t C;    // channels
  size_t Cl;   // channels of each of q, k, v here (this rank's heads times HS)
  size_t NHl;  // heads here
  size_t Fl;   // MLP width here
};

// One block's tensors (parameters or gradients), local block l of a stacked ParamTensors.
struct BlockTensors {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
  float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

BlockTensors BlockOf(const ParamTensors& p, size_t l, const BlockDims& d) {
  const size_t C = d.C, Cl = d.Cl, Fl = d.Fl;
  return BlockTensors{p.ln1w + l * C,      p.ln1b + l * C,          p.qkvw + l * 3 * Cl * C,
                      p.qkvb + l * 3 * Cl, p.attprojw + l * C * Cl, p.attprojb + l * C,
                      p.ln2w + l * C,      p.ln2b + l * C,          p.fcw + l * Fl * C,
                      p.fcb + l * Fl,      p.fcprojw + l * C * Fl,  p.fcprojb + l * C};
}

// One block's activations: the l-th slice of each stacked buffer.
struct BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2;
  float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3;
};

BlockActs BlockActOf(const Activations& a, size_t l, size_t B, size_t T, const BlockDims& d) {
  const size_t N = B * T, C = d.C, Cl = d.Cl, Fl = d.Fl;
  return BlockActs{a.ln1 + l * N * C,       a.ln1_mean + l * N,      a.ln1_rstd + l * N,
                   a.qkv + l * N * 3 * Cl,  a.atty + l * N * Cl,     a.att + l * B * d.NHl * T * T,
                   a.attproj + l * N * C,   a.residual2 + l * N * C, a.ln2 + l * N * C,
                   a.ln2_mean + l * N,      a.ln2_rstd + l * N,      a.fch + l * N * Fl,
                   a.fch_gelu + l * N * Fl, a.fcproj + l * N * C,    a.residual3 + l * N * C};
}

}  // namespace

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
  const BlockDims d{static_cast<size_t>(dims_.channels), static_cast<size_t>(qkv_local_),
                    static_cast<size_t>(heads_local_), static_cast<size_t>(mlp_local_)};
  const int C = dims_.channels, Cl = qkv_local_, Fl = mlp_local_;
  const int N = B * T;
  const long NC = static_cast<long>(N) * C;
  const BlockTensors w = BlockOf(ViewParams(params_.data(), table_), l, d);
  const BlockActs x = BlockActOf(a, l, B, T, d);
  const float* residual = BlockInput(a, l);

  // out (N, C) = inp (N, K) @ weight (C, K)^T + bias, row-parallel: each rank's product is a
  // partial sum over its K columns, so the bias is added once, after the sum.
  auto row_parallel = [&](float* out, const float* inp, const float* weight, const float* bias,
                          int K) {
    if (tp_ == nullptr) {
      k::matmul_forward(out, inp, weight, bias, N, K, C);
      return;
    }
    k::matmul_forward(out, inp, weight, nullptr, N, K, C);
    TpAllReduce(out, static_cast<size_t>(NC));
    for (int n = 0; n < N; ++n) {
      float* row = out + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) row[c] += bias[c];
    }
  };

  k::layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, N, C);
  k::matmul_forward(x.qkv, x.ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);       // (N, 3Cl)
  k::attention_forward(x.atty, x.att, x.qkv, B, T, Cl, heads_local_);  // (N, Cl)
  row_parallel(x.attproj, x.atty, w.attprojw, w.attprojb, Cl);         // (N, C)
  k::residual_forward(x.residual2, residual, x.attproj, NC);
  k::layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, N, C);
  k::matmul_forward(x.fch, x.ln2, w.fcw, w.fcb, N, C, Fl);  // (N, Fl)
  k::gelu_forward(x.fch_gelu, x.fch, static_cast<long>(N) * Fl);
  row_parallel(x.fcproj, x.fch_gelu, w.fcprojw, w.fcprojb, Fl);  // (N, C)
  k::residual_forward(x.residual3, x.residual2, x.fcproj, NC);
}

// On entry scratch_.dresidual holds d(residual3 of block l); on exit d(block input). A residual
// add passes its output gradient unchanged to both inputs, so dresidual is used directly as the
// gradient of the branch output, and each branch's input gradient is added into it.
void GPT::BlockBackward(int l, const Activations& a, int B, int T) {
  const BlockDims d{static_cast<size_t>(dims_.channels), static_cast<size_t>(qkv_local_),
                    static_cast<size_t>(heads_local_), static_cast<size_t>(mlp_local_)};
  const int C = dims_.channels, Cl = qkv_local_, Fl = mlp_local_;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const BlockTensors w = BlockOf(ViewParams(params_.data(), table_), l, d);
  const BlockTensors dw = BlockOf(ViewParams(grads_.data(), table_), l, d);
  const BlockActs x = BlockActOf(a, l, B, T, d);
  const float* residual = BlockInput(a, l);
  const BackwardScratch& s = scratch_;
  // The backward kernels accumulate, so every scratch buffer is zeroed before it is written.
  auto zero = [](float* buf, size_t n) { std::memset(buf, 0, n * sizeof(float)); };
  const size_t NFl = static_cast<size_t>(N) * Fl, NCl = static_cast<size_t>(N) * Cl;

  // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))). The fcprojb gradient
  // is the sum of the replicated dresidual: the whole bias gradient on every tp rank.
  zero(s.dfch_gelu, NFl);
  k::matmul_backward(s.dfch_gelu, dw.fcprojw, dw.fcprojb, s.dresidual, x.fch_gelu, w.fcprojw, N, Fl,
                     C);
  zero(s.dfch, NFl);
  k::gelu_backward(s.dfch, x.fch, s.dfch_gelu, static_cast<long>(NFl));
  zero(s.dln, NC);
  k::matmul_backward(s.dln, dw.fcw, dw.fcb, s.dfch, x.ln2, w.fcw, N, C, Fl);
  TpAllReduce(s.dln, NC);  // each rank's d(ln2) covers only its MLP slice
  k::layernorm_backward(s.dresidual, dw.ln2w, dw.ln2b, s.dln, x.residual2, w.ln2w, x.ln2_mean,
                        x.ln2_rstd, N, C);
  // dresidual now holds d(residual2). Attention branch: residual2 = residual + attn(ln1(...)).
  zero(s.datty, NCl);
  k::matmul_backward(s.datty, dw.attprojw, dw.attprojb, s.dresidual, x.atty, w.attprojw, N, Cl, C);
  zero(s.dqkv, 3 * NCl);
  k::attention_backward(s.dqkv, s.datt, s.datty, x.qkv, x.att, B, T, Cl, heads_local_);
  zero(s.dln, NC);
  k::matmul_backward(s.dln, dw.qkvw, dw.qkvb, s.dqkv, x.ln1, w.qkvw, N, C, 3 * Cl);
  TpAllReduce(s.dln, NC);  // each rank's d(ln1) covers only its heads
  k::layernorm_backward(s.dresidual, dw.ln1w, dw.ln1b, s.dln, residual, w.ln1w, x.ln1_mean,
                        x.ln1_rstd, N, C);
}

}  // namespace loom::train
