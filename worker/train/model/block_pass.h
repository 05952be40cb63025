// One transformer block, forward and backward, written once for both backends: the CPU model
// (gpt_block.cc, fp32 on kernels/cpu) and the GPU model (gpt_cuda.cc, bf16 on kernels/cuda) run
// this same sequence of ops over their own tensors, so the block's math, its order and its
// tensor-parallel all-reduces cannot drift between them.
//
// Megatron's split (DESIGN.md, "TP"): qkvw and fcw are column-parallel (each rank computes its
// heads' q, k, v and its slice of the MLP from the replicated layernorm output), attprojw and
// fcprojw row-parallel (each rank's product is a partial sum over its input slice). So the
// forward pass all-reduces the two row-parallel outputs (inside Ops::RowParallel) and the
// backward pass the two layernorm-output gradients of the column-parallel inputs: two
// all-reduces per block each way. Everything between (layernorms, residuals, the row-parallel
// biases) is replicated and computed identically on every tp rank. With tp = 1 this is llm.c's
// block, op for op.
//
// Shapes of one micro-batch: N = B*T rows, C channels, Cl = C/tp (this rank's heads times HS),
// Fl = 4C/tp.
//
// The Ops contract (T is the backend's element type; statistics are always fp32). Every method
// works on this rank's slices at the model's current (B, T); "+=" marks the ops that accumulate
// into their output, the rest overwrite it:
//   LayerNorm(out, mean, rstd, inp, w, b)                     (N, C)
//   Linear(out, inp, w, b, in, out_ch)                        out (N, out_ch) = inp w^T + b
//   LinearGelu(out, pre, inp, w, b, in, out_ch)               pre = inp w^T + b, out = gelu(pre)
//   Attention(l, out, qkv)                                    causal attention of local block l;
//                                                             keeps what its backward needs
//   RowParallel(out, inp, w, b, in)                           out (N, C) = the tp group's sum of
//                                                             inp w^T, plus b once
//   ResidualLayerNorm(res, out, mean, rstd, a, b, w, bias)    res = a + b, out = layernorm(res)
//   Residual(out, a, b)                                       out = a + b, (N, C)
//   Zero(buf, n)
//   LinearBackward(dinp, dw, db, dout, inp, w, in, out_ch)    dinp, dw, db +=
//   GeluBackward(dinp, pre, dout, n)                          dinp +=
//   AttentionBackward(l, dqkv, dout, qkv, out)                dqkv += (out: the forward's)
//   TpAllReduce(buf, n)                                       sum over the tp group, in place
//   LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd) dinp, dw, db +=
#ifndef LOOM_WORKER_TRAIN_MODEL_BLOCK_PASS_H_
#define LOOM_WORKER_TRAIN_MODEL_BLOCK_PASS_H_

#include <cstddef>

namespace loom::train {

// The sizes of one block on this rank.
struct BlockShape {
  size_t N;   // rows, B*T
  size_t C;   // channels
  size_t Cl;  // channels of each of q, k, v here (this rank's heads times HS)
  size_t Fl;  // MLP width here
};

// One block's parameters or gradients (local block l of the stage, this rank's slices).
template <typename T>
struct BlockTensors {
  T *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
  T *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

// One block's activations of one micro-batch. attproj and fcproj are read by nothing after the
// block's forward: a backend may point both at one shared buffer.
template <typename T>
struct BlockActs {
  T* ln1;           // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  T* qkv;           // (N, 3Cl)  [q | k | v] of this rank's heads
  T* atty;          // (N, Cl)
  T* attproj;       // (N, C)  summed over the tp group, bias added
  T* residual2;     // (N, C)
  T* ln2;           // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  T* fch;           // (N, Fl)  before the GELU
  T* fch_gelu;      // (N, Fl)
  T* fcproj;        // (N, C)  summed over the tp group, bias added
  T* residual3;     // (N, C)  the block's output
};

// The backward pass's buffers, reused by every block.
template <typename T>
struct BlockScratch {
  T* dresidual;  // (N, C) gradient of the residual stream, carried down the blocks
  T* dln;        // (N, C) gradient of a layernorm output
  T* datty;      // (N, Cl)
  T* dqkv;       // (N, 3Cl)
  T* dfch;       // (N, Fl)
  T* dfch_gelu;  // (N, Fl)
};

// Block l's forward: x from `residual` (N, C), the block's input.
template <typename Ops, typename T>
void BlockForwardPass(Ops& ops, int l, const BlockShape& d, const BlockTensors<T>& w,
                      const BlockActs<T>& x, const T* residual) {
  ops.LayerNorm(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b);
  ops.Linear(x.qkv, x.ln1, w.qkvw, w.qkvb, d.C, 3 * d.Cl);  // (N, 3Cl)
  ops.Attention(l, x.atty, x.qkv);                          // (N, Cl)
  ops.RowParallel(x.attproj, x.atty, w.attprojw, w.attprojb, d.Cl);
  ops.ResidualLayerNorm(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, x.attproj, w.ln2w,
                        w.ln2b);
  ops.LinearGelu(x.fch_gelu, x.fch, x.ln2, w.fcw, w.fcb, d.C, d.Fl);  // (N, Fl)
  ops.RowParallel(x.fcproj, x.fch_gelu, w.fcprojw, w.fcprojb, d.Fl);
  ops.Residual(x.residual3, x.residual2, x.fcproj);
}

// Block l's backward. On entry s.dresidual holds d(residual3); on exit d(block input). A residual
// add passes its output gradient unchanged to both inputs, so dresidual is used directly as the
// gradient of each branch's output, and each branch's input gradient is added into it. The
// row-parallel biases' gradients are sums of the replicated dresidual: the whole bias gradient
// on every tp rank. The backward ops accumulate, so every scratch buffer is zeroed first.
template <typename Ops, typename T>
void BlockBackwardPass(Ops& ops, int l, const BlockShape& d, const BlockTensors<T>& w,
                       const BlockTensors<T>& g, const BlockActs<T>& x, const T* residual,
                       const BlockScratch<T>& s) {
  const size_t NC = d.N * d.C, NFl = d.N * d.Fl, NCl = d.N * d.Cl;
  // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
  ops.Zero(s.dfch_gelu, NFl);
  ops.LinearBackward(s.dfch_gelu, g.fcprojw, g.fcprojb, s.dresidual, x.fch_gelu, w.fcprojw, d.Fl,
                     d.C);
  ops.Zero(s.dfch, NFl);
  ops.GeluBackward(s.dfch, x.fch, s.dfch_gelu, NFl);
  ops.Zero(s.dln, NC);
  ops.LinearBackward(s.dln, g.fcw, g.fcb, s.dfch, x.ln2, w.fcw, d.C, d.Fl);
  ops.TpAllReduce(s.dln, NC);  // each rank's d(ln2) covers only its MLP slice
  ops.LayerNormBackward(s.dresidual, g.ln2w, g.ln2b, s.dln, x.residual2, w.ln2w, x.ln2_mean,
                        x.ln2_rstd);
  // dresidual now holds d(residual2). Attention branch: residual2 = residual + attn(ln1(...)).
  ops.Zero(s.datty, NCl);
  ops.LinearBackward(s.datty, g.attprojw, g.attprojb, s.dresidual, x.atty, w.attprojw, d.Cl, d.C);
  ops.Zero(s.dqkv, 3 * NCl);
  ops.AttentionBackward(l, s.dqkv, s.datty, x.qkv, x.atty);
  ops.Zero(s.dln, NC);
  ops.LinearBackward(s.dln, g.qkvw, g.qkvb, s.dqkv, x.ln1, w.qkvw, d.C, 3 * d.Cl);
  ops.TpAllReduce(s.dln, NC);  // each rank's d(ln1) covers only its heads
  ops.LayerNormBackward(s.dresidual, g.ln1w, g.ln1b, s.dln, residual, w.ln1w, x.ln1_mean,
                        x.ln1_rstd);
}

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_BLOCK_PASS_H_
