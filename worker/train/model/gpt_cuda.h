// GPT-2 on one CUDA device in bf16 mixed precision (DESIGN.md, "The training core"): the same
// architecture, parameter table, initialisation and forward/backward order as the CPU model
// (model/gpt.h), on the CUDA ops of kernels/cuda/. No tensor or pipeline parallelism: the whole
// model lives on the device.
//
// Precision: parameters, gradients and activations in bf16; fp32 master weights and AdamW
// moments; fp32 layernorm statistics, losses and cross-entropy row statistics.
//
// Memory: every device buffer comes from one CachingAllocator (parameters and optimizer state at
// construction, activations at Reserve), so steady-state steps allocate nothing. The cuBLASLt
// workspace of the GemmContext is the one cudaMalloc outside it.
//
// Layout of the parameter-shaped buffers (params, grads, master, m, v): the ParamTable's tensors
// in its order, except that wte has Vp = round_up(V, 64) rows instead of V (llm.c's padded
// vocabulary, so that the head GEMM has aligned dimensions). The Vp - V padding rows are zero in
// the parameters, receive a zero gradient (the cross-entropy never writes the padded logits'
// gradient, and dlogits is zeroed first) and so stay zero under AdamW; every other tensor sits
// at its table offset plus the padding, element for element as on the CPU.
//
// Threading: one host thread; all work is enqueued on the model's stream.
#ifndef LOOM_WORKER_TRAIN_MODEL_GPT_CUDA_H_
#define LOOM_WORKER_TRAIN_MODEL_GPT_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cuda/gemm_context.h"
#include "kernels/cuda/types.h"
#include "worker/train/device/caching_allocator.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/padded_layout.h"
#include "worker/train/model/params.h"
#include "worker/train/optim/adamw.h"

namespace loom::train {

class GptCuda {
 public:
  using bf16 = loom::kernels::cuda::bf16;

  // The vocabulary is padded to a multiple of this on the device (llm.c's padding, so the head
  // GEMM's dimension is aligned; padded_layout.h).
  static constexpr int kVocabMultiple = 64;

  // Selects `device` (cudaSetDevice), creates the stream, the GEMM context and the allocator,
  // and allocates the parameter-shaped buffers (uninitialised: call InitWeights). Dims must be
  // valid. Throws OutOfMemoryError when the device cannot hold them.
  GptCuda(const ModelDims& dims, int device);
  // Synchronises the stream, then frees everything.
  ~GptCuda();
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  // GPT-2 initialisation exactly as the CPU model's (InitParams into a host fp32 buffer, same
  // seed): uploaded as the fp32 master weights and cast to the bf16 parameters. Zeroes the
  // AdamW moments.
  void InitWeights(uint64_t seed);

  // Lays out the activations and backward scratch for micro-batches (B, T) in `slots`
  // independent slots (a micro-batch's activations stay in its slot from its forward to its
  // backward, as GPT::Reserve). Requires B >= 1, 1 <= T <= maxT, slots >= 1. Reallocates only
  // when something changed.
  void Reserve(int B, int T, int slots = 1);

  // Forward pass of one micro-batch into `slot`: tokens and targets (B, T) host ints in [0, V)
  // (checked), copied to the device. Enqueued; the per-position losses stay on the device
  // (LossSum).
  void Forward(const int* tokens, const int* targets, int slot = 0);

  // Sum over the B*T positions of the slot's last Forward's losses, in double on the host
  // (copies the (B, T) fp32 losses back; synchronises the stream).
  double LossSum(int slot = 0);

  // Sets every gradient to zero (enqueued); call once per optimizer step.
  void ZeroGrad();

  // Called by Backward on the host as soon as the kernels of a stage are enqueued, with the CPU
  // model's meaning (GPT::GradReadyFn, model/gpt.h): stage L (layers) once lnfw/lnfb are final,
  // then l after block l, then -1 after the embeddings (wte is final only then: the tied head
  // writes it first). Work the callback enqueues on stream() runs after that stage's kernels.
  using GradReadyFn = std::function<void(int stage)>;

  // Adds the gradient of loss_scale * (mean loss of the last Forward) to the gradients.
  // Enqueued. loss_scale = 1/K averages K accumulated micro-batches (1/(K * dp) under data
  // parallelism, so that the group's sum is the mean). `ready`, when set, hears each stage.
  // Uses the activations of `slot`; the slot is free for reuse afterwards.
  void Backward(float loss_scale, const GradReadyFn& ready = nullptr, int slot = 0);

  // The global L2 norm of the gradients (one sum of squares over the whole buffer, fp32 on the
  // device; synchronises the stream).
  double GradNorm();

  // One AdamW step at learning rate lr on every tensor (weight decay on TensorInfo::decay
  // tensors only, as on the CPU), with the gradients multiplied by grad_scale (clipping).
  // `t` is the 1-based optimizer step. Enqueued.
  void Update(const AdamWConfig& config, float lr, float grad_scale, int64_t t);

  // The parameters as fp32 on the host, laid out by tensors() (the unpadded table): for tests
  // and checkpoints. Synchronises.
  std::vector<float> ParamsToHost();

  // The fp32 master weights and AdamW moments, on the host in the table's layout (tensors(),
  // unpadded): what a checkpoint saves, the same format as the CPU model's. Synchronises.
  struct HostState {
    std::vector<float> params;  // (num_params)
    std::vector<float> m;       // (num_params)
    std::vector<float> v;       // (num_params)
  };
  HostState StateToHost();

  // Replaces the master weights and the moments with host buffers in the table's layout
  // (num_params floats each; m and v both nullptr means zero moments), re-derives the bf16
  // parameters (wte's padding rows zero) and zeroes the gradients: what resuming from a
  // checkpoint, written on a GPU or a CPU, loads. Synchronises.
  void LoadState(const float* params, const float* m, const float* v);

  const ModelDims& dims() const { return dims_; }
  int device() const { return device_; }  // the CUDA device the model lives on
  int batch() const { return B_; }        // the Reserve'd micro-batch shape (0 before)
  int seq_len() const { return T_; }
  const std::vector<TensorInfo>& tensors() const { return table_; }
  size_t num_params() const { return num_params_; }
  int padded_vocab() const { return layout_.padded_vocab; }
  // Where each tensor sits in the parameter-shaped device buffers (padded_layout.h).
  const PaddedLayout& layout() const { return layout_; }
  cudaStream_t stream() const { return stream_; }
  AllocatorStats memory_stats() const { return allocator_->GetStats(); }
  // The gradients (num_dev_params, bf16) in the padded layout, and the allocator every device
  // buffer of the model comes from: for the data-parallel gradient buckets (cuda_grad_sync.h).
  bf16* grads() { return grads_; }
  size_t num_dev_params() const { return layout_.total; }
  CachingAllocator* allocator() { return allocator_.get(); }
  // Device bytes outside the allocator (the GEMM context's workspace).
  size_t fixed_bytes() const { return gemm_->workspace_bytes(); }

 private:
  // Activations of one micro-batch (B, T) in one slot; N = B*T. bf16 unless marked fp32.
  struct Acts {
    bf16* encoded;    // (B, T, C)
    bf16* ln1;        // (L, B, T, C)
    float* ln1_mean;  // (L, B, T) fp32
    float* ln1_rstd;  // (L, B, T) fp32
    bf16* qkv;        // (L, B, T, 3C)
    bf16* atty;       // (L, B, T, C)
    bf16* att;        // (L, B, NH, T, T)
    bf16* residual2;  // (L, B, T, C)
    bf16* ln2;        // (L, B, T, C)
    float* ln2_mean;  // (L, B, T) fp32
    float* ln2_rstd;  // (L, B, T) fp32
    bf16* fch;        // (L, B, T, 4C)  pre-GELU, for the GELU backward
    bf16* fch_gelu;   // (L, B, T, 4C)
    bf16* residual3;  // (L, B, T, C)
    bf16* proj;       // (B, T, C)  attproj / fcproj output: only forward reads it, per layer
    bf16* lnf;        // (B, T, C)
    float* lnf_mean;  // (B, T) fp32
    float* lnf_rstd;  // (B, T) fp32
    bf16* logits;     // (B, T, Vp)
    float* lse;       // (B, T) fp32 log-sum-exp per row, for the cross-entropy backward
    float* losses;    // (B, T) fp32
    int* tokens;      // (B, T)
    int* targets;     // (B, T)
  };
  // Backward scratch, reused by every layer.
  struct Grads {
    float* dlosses;     // (B, T) fp32, loss_scale / N each
    bf16* dlogits;      // (B, T, Vp)
    bf16* dresidual;    // (B, T, C) gradient of the residual stream, carried down the layers
    bf16* dln;          // (B, T, C) gradient of a layernorm output
    bf16* datty;        // (B, T, C)
    bf16* dqkv;         // (B, T, 3C)
    bf16* dfch_gelu;    // (B, T, 4C)
    bf16* dfch;         // (B, T, 4C)
    float* ln_scratch;  // LayerNormBackwardScratchFloats(N, C) fp32
    void* att_scratch;  // AttentionScratchBytes(T, NH) bytes (also the forward's)
  };
  // Typed views of one parameter-shaped bf16 buffer (params or grads), in the device layout.
  struct Tensors {
    bf16 *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    bf16 *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
  };

  Tensors View(bf16* base) const;
  void UseSlot(int slot);  // a_ := the slot's activations
  void* Alloc(size_t bytes);
  void FreeActivations();
  void BlockForward(int l, const Tensors& w);
  void BlockBackward(int l, const Tensors& w, const Tensors& g);
  // The residual stream entering block l: encoded, or the previous block's residual3.
  bf16* BlockInput(int l) const;

  ModelDims dims_;
  int device_ = 0;
  std::vector<TensorInfo> table_;   // the CPU model's table (unpadded)
  size_t num_params_ = 0;           // the table's total (unpadded)
  // The device buffers' layout: the table's, wte padded to Vp rows; total = num_params_ + (Vp -
  // V) * C.
  PaddedLayout layout_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<loom::kernels::cuda::GemmContext> gemm_;
  std::unique_ptr<CudaMemory> memory_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<void*> param_blocks_;  // freed in the destructor
  std::vector<void*> act_blocks_;    // freed on a new Reserve and in the destructor
  bf16* params_ = nullptr;           // (num_dev_params) bf16 copy the passes read
  bf16* grads_ = nullptr;            // (num_dev_params)
  float* master_ = nullptr;          // (num_dev_params) fp32
  float* m_ = nullptr;               // (num_dev_params) fp32 AdamW first moment
  float* v_ = nullptr;               // (num_dev_params) fp32 AdamW second moment
  float* norm_partials_ = nullptr;   // (kGradNormBlocks) fp32
  float* norm_out_ = nullptr;        // (1) fp32
  int B_ = 0, T_ = 0;
  float dlosses_value_ = -1.0f;  // what dlosses holds now (re-filled when loss_scale changes)
  Acts a_{};                     // the slot the pass in progress uses (a copy of slot_acts_[i])
  std::vector<Acts> slot_acts_;  // (slots); proj is shared by all
  Grads s_{};
  std::vector<float> host_losses_;  // (B, T)
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_GPT_CUDA_H_
