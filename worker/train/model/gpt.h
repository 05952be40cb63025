// GPT-2: pre-LN transformer blocks, learned position embeddings, tied input/output embedding.
// Forward and backward on the CPU kernels (kernels/), fp32, deterministic.
//
// One block, in the shapes of one micro-batch (B sequences of T tokens, N = B*T rows):
//   ln1      = layernorm(residual)                     (N, C)
//   qkv      = ln1 @ qkvw^T + qkvb                      (N, 3C)
//   atty     = causal_attention(qkv)                    (N, C)    att probabilities (B, NH, T, T)
//   residual2 = residual + atty @ attprojw^T + attprojb (N, C)
//   ln2      = layernorm(residual2)                     (N, C)
//   fch_gelu = gelu(ln2 @ fcw^T + fcb)                  (N, 4C)
//   residual3 = residual2 + fch_gelu @ fcprojw^T + fcprojb (N, C)
// and around the blocks: encoded = wte[tokens] + wpe[positions]; logits = layernorm(x) @ wte^T.
#ifndef LOOM_WORKER_TRAIN_MODEL_GPT_H_
#define LOOM_WORKER_TRAIN_MODEL_GPT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "worker/train/model/dims.h"
#include "worker/train/model/params.h"
#include "worker/train/model/stage_pass.h"
#include "worker/train/profiler/block_costs.h"
#include "worker/train/profiler/trace_recorder.h"

namespace loom::train {

// Everything the forward pass keeps for the backward pass, for one micro-batch shape (B, T) of
// one stage. Per-layer buffers are stacked along a leading Lb dimension, the stage's blocks
// (Lb = last_block - first_block; L on the whole model). Under tensor parallelism the sliced
// buffers hold this rank's part: Cl = C/tp channels of q, k, v and atty (its NH/tp heads),
// Fl = 4C/tp of the MLP; the others are replicated over the tp group.
struct Activations {
  float* encoded;    // (B, T, C)  the stage's input: the embedding, or the previous stage's output
  float* ln1;        // (Lb, B, T, C)
  float* ln1_mean;   // (Lb, B, T)
  float* ln1_rstd;   // (Lb, B, T)
  float* qkv;        // (Lb, B, T, 3Cl)  [q | k | v] of this rank's heads
  float* atty;       // (Lb, B, T, Cl)
  float* att;        // (Lb, B, NH/tp, T, T)
  float* attproj;    // (Lb, B, T, C)  summed over the tp group, bias added
  float* residual2;  // (Lb, B, T, C)
  float* ln2;        // (Lb, B, T, C)
  float* ln2_mean;   // (Lb, B, T)
  float* ln2_rstd;   // (Lb, B, T)
  float* fch;        // (Lb, B, T, Fl)
  float* fch_gelu;   // (Lb, B, T, Fl)
  float* fcproj;     // (Lb, B, T, C)  summed over the tp group, bias added
  float* residual3;  // (Lb, B, T, C)
  // The last stage only (nullptr elsewhere):
  float* lnf;       // (B, T, C)
  float* lnf_mean;  // (B, T)
  float* lnf_rstd;  // (B, T)
  float* logits;    // (B, T, V)
  float* probs;     // (B, T, V)
  float* losses;    // (B, T)
};

// Gradient buffers of the backward pass. Unlike the activations they are neither per layer nor
// per slot: the backward pass walks the layers one at a time and reuses them.
struct BackwardScratch {
  float* dlosses;    // (B, T)     last stage only (else nullptr)
  float* dlogits;    // (B, T, V)  last stage only (else nullptr)
  float* dresidual;  // (B, T, C)  gradient of the residual stream, carried down the layers
  float* dln;        // (B, T, C)  gradient of a layernorm output (lnf, ln2, ln1)
  float* datty;      // (B, T, Cl)
  float* dqkv;       // (B, T, 3Cl)
  float* dfch;       // (B, T, Fl)
  float* dfch_gelu;  // (B, T, Fl)
  float* datt;       // (B, NH/tp, T, T) attention's own scratch
};

class Communicator;

class GPT {
 public:
  // Allocates the parameters of the part `shard` holds (uninitialised: call InitWeights or load
  // them). Dims must be valid (DimsProblem(dims) empty) and ShardProblem(dims, shard) empty.
  // `tp` is the tensor-parallel group (size shard.tp_size, rank shard.tp_rank; outlives the
  // model); nullptr when tp_size == 1. The forward pass all-reduces the partial outputs of the
  // row-parallel attprojw and fcprojw over it, the backward pass the partial input gradients of
  // the column-parallel qkvw and fcw (two all-reduces per block in each direction).
  explicit GPT(const ModelDims& dims, const ModelShard& shard = ModelShard{},
               Communicator* tp = nullptr);

  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  // GPT-2 initialisation, deterministic in `seed` (see InitParams): every shard starts from its
  // slice of the single-rank model's weights.
  void InitWeights(uint64_t seed);

  // Lays out activations for micro-batches of shape (B, T) in `slots` independent slots: a
  // pipeline stage keeps up to `slots` micro-batches between their forward and their backward.
  // Requires B >= 1, 1 <= T <= maxT, slots >= 1. Reallocates only when something changed.
  void Reserve(int B, int T, int slots);

  // The forward pass of one micro-batch of this stage, kept in `slot` for its backward.
  //   - The first stage reads `tokens` (B, T) ids in [0, V) (`input` ignored); the others read
  //     `input` (B, T, C), the previous stage's Output (tokens ignored).
  //   - The last stage with `targets` (B, T) returns the mean cross-entropy over the B*T
  //     positions; without targets it stops at the logits. Other stages return 0 and leave the
  //     residual stream for the next stage in Output(slot).
  float ForwardMicro(int slot, const int* tokens, const float* input, const int* targets);

  // (B, T, C): the residual stream leaving this stage's last block after ForwardMicro(slot).
  const float* Output(int slot) const;

  // Adds the gradient of the micro-batch in `slot` to grads(). The last stage starts from its
  // loss (requires targets in that ForwardMicro) times loss_scale; other stages start from
  // `doutput` (B, T, C) = d(Output(slot)), received from the next stage. Afterwards, on every
  // stage but the first, InputGrad() holds d(input) (B, T, C) for the previous stage, valid until
  // the next BackwardMicro. The slot is free for reuse afterwards.
  void BackwardMicro(int slot, float loss_scale, const float* doutput,
                     const std::function<void(int stage)>& ready = nullptr);
  const float* InputGrad() const;  // (B, T, C)

  // The whole model on one rank: Reserve(B, T, 1) + ForwardMicro(0, inputs, nullptr, targets).
  // Requires a shard that is both the first and the last stage.
  float Forward(const int* inputs, const int* targets, int B, int T);

  // Sets every gradient to zero; call once per optimizer step (Backward accumulates).
  void ZeroGrad();

  // Called by Backward as soon as the gradients of a stage will not be written again in this
  // pass: stage L (layers) for lnfw/lnfb (and, on a last stage that is not the first, wte),
  // then stage l for block l's tensors, walking down this shard's blocks, then, on the first
  // stage, -1 for wte and wpe (wte is also written by the tied output head at the start, so on
  // a single stage it is final only after the encoder). Runs on the calling thread, in that
  // order. Stage numbers are global block indices.
  using GradReadyFn = std::function<void(int stage)>;

  // BackwardMicro(0, loss_scale, nullptr, ready). Requires a Forward with targets just before.
  // loss_scale = 1/K averages K accumulated micro-batches.
  void Backward(float loss_scale, const GradReadyFn& ready = nullptr);

  const ModelDims& dims() const { return dims_; }
  const ModelShard& shard() const { return shard_; }  // last_block resolved (never -1)
  bool first_stage() const { return shard_.first_block == 0; }
  bool last_stage() const { return shard_.last_block == dims_.layers; }
  // The local table (ShardTable): 16 entries, numel 0 for the tensors not held here.
  const std::vector<TensorInfo>& tensors() const { return table_; }
  size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // The logits (B, T, V) of the last ForwardMicro on the last stage (the slot's logits).
  const float* logits() const;
  int batch() const { return B_; }
  int seq_len() const { return T_; }

  // Per-block timing (profiler/block_costs.h): while `costs` is set (not owned, outlives the
  // calls), ForwardMicro and BackwardMicro add the wall seconds of the embedding, each block and
  // the head + loss to it; nullptr (the default) times nothing. The caller Resets it per step.
  void set_block_costs(BlockCosts* costs) { costs_ = costs; }
  // The rank's timeline (profiler/trace_recorder.h; not owned, nullptr: none): each
  // tensor-parallel all-reduce becomes a record of the recorder's current micro-batch.
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

  // Bytes this model has allocated: parameters, gradients, activations (every slot), backward
  // scratch and the token copies; a few bytes of bookkeeping are left out.
  size_t bytes_allocated() const;

 private:
  // The forward and backward pass of block l (local index, 0 = first_block) of the micro-batch
  // in `a`; see gpt_block.cc.
  // The shared block pass (block_pass.h) over the CPU kernels: gpt_block.cc.
  struct BlockOps;
  void BlockForward(int l, const Activations& a, int B, int T);
  void BlockBackward(int l, const Activations& a, int B, int T);
  // Sums buf (n) over the tp group in place (nothing without tensor parallelism).
  void TpAllReduce(float* buf, size_t n);
  // The residual stream entering local block l of `a`.
  const float* BlockInput(const Activations& a, int l) const;
  void EnsureScratch();
  // Which part of the model this stage holds, for stage_pass.h.
  StageShape stage_shape() const;

  ModelDims dims_;
  ModelShard shard_;
  Communicator* tp_ = nullptr;  // nullptr without tensor parallelism (tp_size == 1)
  std::vector<TensorInfo> table_;
  int blocks_ = 0;             // Lb: this stage's blocks
  int heads_local_ = 0;        // NH / tp
  int qkv_local_ = 0;          // Cl = C / tp, channels of each of q, k, v on this rank
  int mlp_local_ = 0;          // Fl = 4C / tp
  std::vector<float> params_;  // (num_params)
  std::vector<float> grads_;   // (num_params), allocated on the first ZeroGrad
  int B_ = 0, T_ = 0;          // the shape the activations were laid out for
  int slots_ = 0;
  std::vector<float> act_memory_;      // slots_ consecutive activation layouts
  std::vector<float> scratch_memory_;  // laid out on the first backward after a Reserve
  std::vector<Activations> acts_;      // (slots_) views into act_memory_
  BackwardScratch scratch_{};
  std::vector<int> inputs_;   // (slots, B, T) token copies for the encoder backward (first stage)
  std::vector<int> targets_;  // (slots, B, T) (last stage)
  std::vector<bool> have_targets_;  // (slots)
  int last_forward_slot_ = 0;       // whose logits logits() returns
  BlockCosts* costs_ = nullptr;     // set on sampled steps only
  TraceRecorder* trace_ = nullptr;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_GPT_H_
