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

namespace loom::train {

// Everything the forward pass keeps for the backward pass, for one micro-batch shape (B, T).
// Per-layer buffers are stacked along a leading L dimension.
struct Activations {
  float* encoded;    // (B, T, C)
  float* ln1;        // (L, B, T, C)
  float* ln1_mean;   // (L, B, T)
  float* ln1_rstd;   // (L, B, T)
  float* qkv;        // (L, B, T, 3C)
  float* atty;       // (L, B, T, C)
  float* att;        // (L, B, NH, T, T)
  float* attproj;    // (L, B, T, C)
  float* residual2;  // (L, B, T, C)
  float* ln2;        // (L, B, T, C)
  float* ln2_mean;   // (L, B, T)
  float* ln2_rstd;   // (L, B, T)
  float* fch;        // (L, B, T, 4C)
  float* fch_gelu;   // (L, B, T, 4C)
  float* fcproj;     // (L, B, T, C)
  float* residual3;  // (L, B, T, C)
  float* lnf;        // (B, T, C)
  float* lnf_mean;   // (B, T)
  float* lnf_rstd;   // (B, T)
  float* logits;     // (B, T, V)
  float* probs;      // (B, T, V)
  float* losses;     // (B, T)
};

// Gradient buffers of the backward pass. Unlike the activations they are not per layer: the
// backward pass walks the layers one at a time and reuses them.
struct BackwardScratch {
  float* dlosses;    // (B, T)
  float* dlogits;    // (B, T, V)
  float* dresidual;  // (B, T, C)  gradient of the residual stream, carried down the layers
  float* dln;        // (B, T, C)  gradient of a layernorm output (lnf, ln2, ln1)
  float* datty;      // (B, T, C)
  float* dqkv;       // (B, T, 3C)
  float* dfch;       // (B, T, 4C)
  float* dfch_gelu;  // (B, T, 4C)
  float* datt;       // (B, NH, T, T) attention's own scratch
};

class GPT {
 public:
  // Allocates the parameters (uninitialised: call InitWeights or load them). Dims must be valid
  // (DimsProblem(dims) empty).
  explicit GPT(const ModelDims& dims);

  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  // GPT-2 initialisation, deterministic in `seed` (see InitParams).
  void InitWeights(uint64_t seed);

  // Runs the model on `inputs` (B, T) token ids in [0, V). With `targets` (B, T) it computes
  // the cross-entropy and returns the mean loss over the B*T positions; with targets == nullptr
  // it stops at the logits and returns 0. Requires 1 <= T <= maxT. Reallocates the activations
  // when (B, T) changes.
  float Forward(const int* inputs, const int* targets, int B, int T);

  // Sets every gradient to zero; call once per optimizer step (Backward accumulates).
  void ZeroGrad();

  // Called by Backward as soon as the gradients of a stage will not be written again in this
  // pass: stage L (layers) for lnfw/lnfb, then stage l for block l's tensors, walking down to
  // 0, then stage -1 for wte and wpe (wte is also written by the tied output head at the start,
  // so it is final only after the encoder). Runs on the calling thread, in that order.
  using GradReadyFn = std::function<void(int stage)>;

  // Adds the gradient of (loss_scale * mean loss of the last Forward) to grads(). Requires a
  // Forward with targets just before. loss_scale = 1/K averages K accumulated micro-batches.
  // `ready`, when set, hears each stage's gradients become final (data-parallel buckets).
  void Backward(float loss_scale, const GradReadyFn& ready = nullptr);

  const ModelDims& dims() const { return dims_; }
  const std::vector<TensorInfo>& tensors() const { return table_; }
  size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // The logits (B, T, V) of the last Forward.
  const float* logits() const { return acts_.logits; }
  int batch() const { return B_; }
  int seq_len() const { return T_; }

  // Bytes this model has allocated: parameters, gradients, activations, backward scratch.
  size_t bytes_allocated() const;

 private:
  void EnsureActivations(int B, int T);

  ModelDims dims_;
  std::vector<TensorInfo> table_;
  std::vector<float> params_;  // (num_params)
  std::vector<float> grads_;   // (num_params), allocated on the first ZeroGrad
  int B_ = 0, T_ = 0;          // the shape the activations were laid out for
  std::vector<float> act_memory_;
  std::vector<float> scratch_memory_;
  Activations acts_{};
  BackwardScratch scratch_{};
  std::vector<int> inputs_;   // (B, T) copies for the backward pass
  std::vector<int> targets_;  // (B, T)
  bool have_targets_ = false;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_GPT_H_
