// GPT-2 on one CUDA device in bf16 mixed precision (DESIGN.md, "The training core"): the same
// architecture, parameter table, initialisation and forward/backward order as the CPU model
// (model/gpt.h), on the CUDA ops of kernels/cuda/, for the part of the model a rank holds under
// any layout: its pipeline stage's blocks (ModelShard first_block..last_block; the embeddings on
// the first stage, the final layernorm and the tied head on the last) and its tensor-parallel
// slice (Megatron's column-parallel qkvw and fcw, row-parallel attprojw and fcprojw, as
// gpt_block.cc): the ShardTable of model/params.h, the CPU model's.
//
// Tensor parallelism: the row-parallel products are partial sums over the tp group; each one is
// summed in place by a bf16 all-reduce over `tp` (an NcclCommunicator on this device, ordered
// behind the model's stream; the stream waits for the sum on the device). The row-parallel
// biases are added by tp rank 0 alone, inside its GEMM, so the group's sum holds them once (the
// CPU model adds them after the sum; the same value up to rounding). In backward the gradients
// of the two layernorm outputs that feed the column-parallel layers are summed the same way.
//
// Precision: parameters, gradients and activations in bf16; fp32 master weights and AdamW
// moments; fp32 layernorm statistics, losses and cross-entropy row statistics.
//
// Memory: every device buffer comes from one CachingAllocator (parameters and optimizer state at
// construction, activations at Reserve), so steady-state steps allocate nothing. The cuBLASLt
// workspace of the GemmContext is the one cudaMalloc outside it.
//
// Layout of the parameter-shaped buffers (params, grads, master, m, v): the shard table's
// tensors in its order, except that wte, where held, has Vp = round_up(V, 64) rows instead of V
// (llm.c's padded vocabulary, so that the head GEMM has aligned dimensions). The Vp - V padding
// rows are zero in the parameters, receive a zero gradient (the cross-entropy never writes the
// padded logits' gradient, and dlogits is zeroed first) and so stay zero under AdamW; every
// other tensor sits at its table offset plus the padding, element for element as on the CPU.
//
// Optimizer range (ZeRO-1): the fp32 master weights and the AdamW moments are held, and
// updated, for one contiguous range [begin, end) of the shard's table only (MasterRange; the whole
// table by default). They are stored in the table's layout from `begin` (no padding rows), so a
// range maps to at most one span per tensor of the padded device buffers (ForEachSpan). The bf16
// parameters and gradients are always the whole shard's: the data-parallel collectives of ZeRO-1
// (cuda_zero.h) fill in the other ranges.
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
#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/device/caching_allocator.h"
#include "worker/train/device/cuda_memory.h"
#include "worker/train/model/block_pass.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/padded_layout.h"
#include "worker/train/model/params.h"
#include "worker/train/model/stage_pass.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/profiler/block_costs.h"

namespace loom::train {

// The part of a shard's table whose masters and moments a GptCuda holds (the header comment);
// end is clipped to num_params() (SIZE_MAX: everything).
struct GptCudaMasterRange {
  size_t begin = 0;
  size_t end = SIZE_MAX;
};

class GptCuda {
 public:
  using bf16 = loom::kernels::cuda::bf16;

  // The vocabulary is padded to a multiple of this on the device (llm.c's padding, so the head
  // GEMM's dimension is aligned; padded_layout.h).
  static constexpr int kVocabMultiple = 64;

  using MasterRange = GptCudaMasterRange;

  // Selects `device` (cudaSetDevice), creates the stream, the GEMM context and the allocator,
  // and allocates the parameter-shaped buffers of `shard` (uninitialised: call InitWeights).
  // Dims must be valid and ShardProblem(dims, shard) empty. `tp` is the tensor-parallel group
  // on `device` (size shard.tp_size, rank shard.tp_rank; outlives the model), nullptr when
  // tp_size == 1. Throws OutOfMemoryError when the device cannot hold the buffers.
  // `range` selects the masters and moments held (begin <= num_params, the header comment).
  // `fused_attention`: the fused attention kernels where the head size allows them (false: the
  // unfused ones everywhere; JobConfig::attention "unfused").
  GptCuda(const ModelDims& dims, int device, const ModelShard& shard = ModelShard{},
          NcclCommunicator* tp = nullptr, MasterRange range = MasterRange{},
          bool fused_attention = true);
  // Synchronises the stream, then frees everything.
  ~GptCuda();
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  // GPT-2 initialisation exactly as the CPU model's (InitParams of the shard table into a host
  // fp32 buffer, same seed: every shard starts from its slice of the single-rank model),
  // uploaded as the fp32 master weights (of the range) and cast to the bf16 parameters (all of
  // them). Zeroes the moments.
  void InitWeights(uint64_t seed);

  // Lays out the activations and backward scratch for micro-batches (B, T) in `slots`
  // independent slots (a micro-batch's activations stay in its slot from its forward to its
  // backward, as GPT::Reserve). Requires B >= 1, 1 <= T <= maxT, slots >= 1. Reallocates only
  // when something changed.
  void Reserve(int B, int T, int slots = 1);

  // The forward pass of one micro-batch of this stage into `slot` (GPT::ForwardMicro):
  //   - the first stage reads `tokens` (B, T), host ints in [0, V) (checked), copied to the
  //     device; the others read `input` (B, T, C), a device buffer: the previous stage's Output;
  //   - the last stage with `targets` (B, T) (host, checked) computes the per-position losses
  //     (LossSum); the others leave the residual stream in Output(slot).
  // Enqueued.
  void ForwardMicro(int slot, const int* tokens, const bf16* input, const int* targets);
  // The whole model: ForwardMicro(slot, tokens, nullptr, targets).
  void Forward(const int* tokens, const int* targets, int slot = 0);

  // Sum over the B*T positions of the slot's last forward's losses (last stage, with targets),
  // in double on the host (copies the (B, T) fp32 losses back; synchronises the stream).
  double LossSum(int slot = 0);

  // (B, T, C) device: the residual stream leaving this stage after ForwardMicro(slot).
  const bf16* Output(int slot) const;

  // Sets every gradient to zero (enqueued); call once per optimizer step.
  void ZeroGrad();

  // Called on the host as soon as the kernels of a stage are enqueued, with the CPU model's
  // meaning (GPT::GradReadyFn, model/gpt.h): stage L (layers) once lnfw/lnfb are final (last
  // stage), then each block's global index as its gradients are, down this shard's blocks,
  // then -1 after the embeddings (first stage; wte is final only then: the tied head writes it
  // first). Work the callback enqueues on stream() runs after that stage's kernels.
  using GradReadyFn = std::function<void(int stage)>;

  // Adds the gradient of the micro-batch in `slot` (GPT::BackwardMicro): the last stage starts
  // from loss_scale * its mean loss (a ForwardMicro with targets first), the others from
  // `doutput` (B, T, C, device) = d(Output(slot)). Afterwards, on every stage but the first,
  // InputGrad() holds d(input) (B, T, C, device) until the next BackwardMicro. Enqueued.
  void BackwardMicro(int slot, float loss_scale, const bf16* doutput,
                     const GradReadyFn& ready = nullptr);
  // The whole model: BackwardMicro(slot, loss_scale, nullptr, ready).
  void Backward(float loss_scale, const GradReadyFn& ready = nullptr, int slot = 0);
  const bf16* InputGrad() const;

  // While set (the trainer's sampled steps, profiler/block_costs.h), ForwardMicro and
  // BackwardMicro add each block's, the embedding's and the head's seconds to `costs`, timed on
  // the host around a synchronisation of the stream after each (so a sampled step runs without
  // overlap between the host and the device; the others are untouched). nullptr: no timing.
  void set_block_costs(BlockCosts* costs) { costs_ = costs; }

  // The L2 norm of all of this shard's gradients (one sum of squares over the buffer, fp32 on
  // the device; synchronises the stream).
  double GradNorm();
  // Sums of squares of the gradients of the tensors this rank owns (TensorInfo::owner: each
  // tensor once over the tp group and the stages) within the master range, added into parts
  // (Backend::OwnedGradSumSquares): this rank's terms of the world's norm. One reduction per
  // tensor, not per block: a stacked tensor's sum goes to the part of its first block, so the
  // GPU's norm is the same total but not summed alike under every pipeline split. Synchronises
  // the stream.
  void OwnedSumSquares(double* parts);

  // One AdamW step at learning rate lr on the master range (weight decay on TensorInfo::decay
  // tensors only, as on the CPU), with the gradients multiplied by grad_scale (clipping); the
  // bf16 parameters of the range follow.
  // `t` is the 1-based optimizer step. Enqueued.
  void Update(const AdamWConfig& config, float lr, float grad_scale, int64_t t);

  // The parameters as fp32 on the host, laid out by tensors() (the unpadded table): for tests.
  // Needs the whole table as the master range. Synchronises.
  std::vector<float> ParamsToHost();

  // The fp32 master weights and AdamW moments of the master range, on the host in the table's
  // layout (tensors(), unpadded, from range_begin()): what a checkpoint saves, the same format
  // as the CPU model's. Synchronises.
  struct HostState {
    std::vector<float> params;  // (range_end - range_begin)
    std::vector<float> m;       // (range_end - range_begin)
    std::vector<float> v;       // (range_end - range_begin)
  };
  HostState StateToHost();

  // Replaces the parameters (params: num_params floats in the table's layout; the bf16 copy of
  // all of them, wte's padding rows zero, and the masters of the range) and the moments of the
  // range (m, v: range_end - range_begin floats each; both nullptr means zero moments), and
  // zeroes the gradients: what resuming from a checkpoint, written on a GPU or a CPU, loads.
  // Synchronises.
  void LoadState(const float* params, const float* m, const float* v);

  const ModelDims& dims() const { return dims_; }
  const ModelShard& shard() const { return shard_; }  // last_block resolved (never -1)
  bool first_stage() const { return shard_.first_block == 0; }
  bool last_stage() const { return shard_.last_block == dims_.layers; }
  int device() const { return device_; }  // the CUDA device the model lives on
  int batch() const { return B_; }        // the Reserve'd micro-batch shape (0 before)
  int seq_len() const { return T_; }
  // The shard's table (ShardTable; numel 0 for the tensors not held here).
  const std::vector<TensorInfo>& tensors() const { return table_; }
  size_t num_params() const { return num_params_; }
  size_t range_begin() const { return range_.begin; }
  size_t range_end() const { return range_.end; }
  bool whole_range() const { return range_.begin == 0 && range_.end == num_params_; }
  // Calls fn(tensor, device_offset, table_offset, n) for each piece of the table range
  // [lo, hi) (clipped to num_params), one per tensor it crosses, in table order: where those
  // elements sit in the padded device buffers (params, grads).
  void ForEachSpan(size_t lo, size_t hi,
                   const std::function<void(int, size_t, size_t, size_t)>& fn) const;
  // The bf16 parameters (num_dev_params, padded layout) and the range's fp32 masters and
  // moments (range_end - range_begin, table layout): for ZeRO-1's collectives.
  bf16* params() { return params_; }
  float* master() { return master_; }
  float* moment1() { return m_; }
  float* moment2() { return v_; }
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
  // Activations of one micro-batch (B, T) in one slot; N = B*T; Lb = the stage's blocks;
  // Cl = C/tp (this rank's heads times HS), Fl = 4C/tp. bf16 unless marked fp32. nullptr where
  // the stage has no use for a buffer.
  struct Acts {
    bf16* encoded;    // (B, T, C)  the stage's input: the embedding, or the previous stage's
    bf16* ln1;        // (Lb, B, T, C)
    float* ln1_mean;  // (Lb, B, T) fp32
    float* ln1_rstd;  // (Lb, B, T) fp32
    bf16* qkv;        // (Lb, B, T, 3Cl)
    bf16* atty;       // (Lb, B, T, Cl)
    bf16* att;        // (Lb, B, NH/tp, T, T) probabilities (unfused attention only)
    float* att_lse;   // (Lb, B, NH/tp, T) fp32 log-sum-exp per query (fused attention only)
    bf16* residual2;  // (Lb, B, T, C)
    bf16* ln2;        // (Lb, B, T, C)
    float* ln2_mean;  // (Lb, B, T) fp32
    float* ln2_rstd;  // (Lb, B, T) fp32
    bf16* fch;        // (Lb, B, T, Fl)  pre-GELU, for the GELU backward
    bf16* fch_gelu;   // (Lb, B, T, Fl)
    bf16* residual3;  // (Lb, B, T, C)
    bf16* proj;       // (B, T, C)  attproj / fcproj output: only forward reads it; shared
    bf16* lnf;        // (B, T, C)   last stage
    float* lnf_mean;  // (B, T) fp32 last stage
    float* lnf_rstd;  // (B, T) fp32 last stage
    bf16* logits;     // (B, T, Vp)  last stage
    float* lse;       // (B, T) fp32 log-sum-exp per row, for the cross-entropy backward
    float* losses;    // (B, T) fp32 last stage
    int* tokens;      // (B, T)  first stage
    int* targets;     // (B, T)  last stage
  };
  // Backward scratch, reused by every layer.
  struct Grads {
    float* dlosses;     // (B, T) fp32, loss_scale / N each (last stage)
    bf16* dlogits;      // (B, T, Vp) (last stage)
    bf16* dresidual;    // (B, T, C) gradient of the residual stream, carried down the layers
    bf16* dln;          // (B, T, C) gradient of a layernorm output
    bf16* datty;        // (B, T, Cl)
    bf16* dqkv;         // (B, T, 3Cl)
    bf16* dfch_gelu;    // (B, T, Fl)
    bf16* dfch;         // (B, T, Fl)
    float* ln_scratch;  // LayerNormBackwardScratchFloats(N, C) fp32
    // Fused: FlashAttentionScratchBytes(B, T, NH/tp) bytes (backward only); unfused:
    // AttentionScratchBytes(T, NH/tp) (forward and backward).
    void* att_scratch;
  };
  // Typed views of one parameter-shaped bf16 buffer (params or grads), in the device layout.
  struct Tensors {
    bf16 *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    bf16 *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
  };

  Tensors View(bf16* base) const;
  void* Alloc(size_t bytes);
  void FreeActivations();
  void UseSlot(int slot);  // a_ := the slot's activations
  // The shared block pass (block_pass.h) over the CUDA kernels: gpt_cuda.cc.
  struct BlockOps;
  BlockTensors<bf16> BlockOf(const Tensors& t, size_t l) const;
  BlockActs<bf16> BlockActOf(size_t l) const;
  void BlockForward(int l, const Tensors& w);
  void BlockBackward(int l, const Tensors& w, const Tensors& g);
  // Sums buf (n bf16) over the tp group in place, on the device (nothing without tp).
  void TpAllReduce(bf16* buf, size_t n);
  // The residual stream entering local block l: encoded, or the previous block's residual3.
  bf16* BlockInput(int l) const;
  // Waits for the stream, then returns the seconds since the previous lap (block costs only).
  double DeviceLap(Lap& lap);
  // Which part of the model this stage holds, for stage_pass.h.
  StageShape stage_shape() const;
  // params_ := bf16 of host_table (num_params, the table's layout), padding rows zero; through
  // master_ (whole range) or staging_. Synchronises.
  void UploadParams(const float* host_table);

  ModelDims dims_;
  int device_ = 0;
  ModelShard shard_;
  NcclCommunicator* tp_ = nullptr;  // nullptr without tensor parallelism
  int blocks_ = 0;                  // Lb
  int heads_local_ = 0;             // NH / tp
  int qkv_local_ = 0;               // Cl
  // The fused attention kernels (kernels/cuda/flash_attention.h) where they handle the head size
  // (launch::FlashAttentionSupported) unless the constructor was told otherwise, else the unfused
  // ones. The planner's memory model (server/planner/cuda_backend_memory.cc) assumes the default
  // choice.
  bool flash_ = false;
  int mlp_local_ = 0;               // Fl
  std::vector<TensorInfo> table_;   // the shard's table (unpadded)
  size_t num_params_ = 0;           // the table's total (unpadded)
  // The device buffers' layout: the table's, wte padded to Vp rows where held.
  PaddedLayout layout_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<loom::kernels::cuda::GemmContext> gemm_;
  std::unique_ptr<CudaMemory> memory_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<void*> param_blocks_;  // freed in the destructor
  std::vector<void*> act_blocks_;    // freed on a new Reserve and in the destructor
  bf16* params_ = nullptr;           // (num_dev_params) bf16 copy the passes read
  bf16* grads_ = nullptr;            // (num_dev_params)
  MasterRange range_;                // resolved: end <= num_params_
  float* master_ = nullptr;          // (range) fp32, the table's layout from range_.begin
  float* m_ = nullptr;               // (range) fp32 AdamW first moment
  float* v_ = nullptr;               // (range) fp32 AdamW second moment
  float* staging_ = nullptr;         // (kStagingFloats) fp32 uploads; only when !whole_range()
  static constexpr size_t kStagingFloats = size_t{1} << 18;
  float* norm_partials_ = nullptr;   // (kGradNormBlocks) fp32
  float* norm_out_ = nullptr;        // (kNumParamTensors) fp32: one sum of squares per tensor
  int B_ = 0, T_ = 0;
  float dlosses_value_ = -1.0f;  // what dlosses holds now (re-filled when loss_scale changes)
  Acts a_{};                     // the slot the pass in progress uses (a copy of slot_acts_[i])
  std::vector<Acts> slot_acts_;  // (slots); proj is shared by all
  Grads s_{};
  bool have_input_grad_ = false;    // a BackwardMicro ran since the last Reserve
  BlockCosts* costs_ = nullptr;     // set on sampled steps (set_block_costs)
  std::vector<float> host_losses_;  // (B, T)
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_GPT_CUDA_H_
