// The device side of one rank's training (DESIGN.md, "One core, two backends"): its part of the
// model, its gradients and optimizer state, and the collectives that touch them, on one device.
// The step loop (trainer.h: micro-batches, pipeline schedule, loss, clipping, checkpoints,
// progress) is written once over this interface; cpu_backend.h implements it in fp32 on host
// memory, and a CUDA implementation in bf16 with fp32 master weights on a device.
//
// Buffers: the pointers this interface takes and returns for activations ("stage buffers",
// (B, T, C) in the backend's activation type) live where the backend computes: host memory on
// the CPU, device memory on a GPU. The trainer never reads them; it hands them to the pipeline
// communicator (whose Send and Recv move stage_floats() fp32-sized words, so a bf16 buffer
// travels as raw bytes) and back to the backend. Tokens and targets are host ints.
//
// Layouts: the parameter-shaped state (parameters, gradients, moments) is laid out by tensors(),
// the rank's ShardTable (model/params.h); host views and checkpoints use exactly that layout on
// every backend, so a checkpoint written by one backend loads on the other.
//
// Threading: every method is called from the training thread. The communicators handed to the
// backend run their own threads (comm/communicator.h).
#ifndef LOOM_WORKER_TRAIN_BACKEND_H_
#define LOOM_WORKER_TRAIN_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/train/comm/communicator.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/params.h"
#include "worker/train/profiler/block_costs.h"
#include "worker/train/profiler/step_profiler.h"
#include "worker/train/profiler/trace_recorder.h"

namespace loom::train {

struct StepResult;

// The data-parallel gradient all-reduce in buckets (CPU: parallel/grad_buckets.h), as the step
// loop drives it: Begin before the step's first backward, StageReady from the last
// micro-batch's backward as each stage's gradients become final, Finish after backward.
class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual void Begin() = 0;
  virtual void StageReady(int stage) = 0;
  // Launches what is left, waits for every bucket and leaves the group's mean in the gradients
  // (for the optimizer: a device backend may leave the last copies queued on its stream).
  // Throws CommError.
  virtual void Finish() = 0;
  // The last step's timings, valid after Backend::EndStep: the time the step waited on the
  // buckets after backward (the exposed part) and the time they kept communication busy.
  virtual double wait_seconds() const = 0;
  virtual double comm_seconds() const = 0;
  virtual size_t bytes_per_step() const = 0;  // what this rank all-reduces per step
  virtual size_t num_buckets() const = 0;
  // The last step's buckets as timeline spans (steady clock nanoseconds, bytes).
  struct Span {
    int64_t began = 0, done = 0;
    size_t bytes = 0;
  };
  virtual std::vector<Span> spans() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- the model (the contracts of model/gpt.h, on this backend's buffers) ----

  virtual const ModelDims& dims() const = 0;
  virtual const ModelShard& shard() const = 0;  // last_block resolved
  // The local table: parameter-shaped buffers are laid out by it (numel 0: not held here).
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  virtual size_t num_params() const = 0;
  // "cpu" or "cuda:N".
  virtual std::string device_name() const = 0;

  // Activations for micro-batches (B, T) in `slots` slots (GPT::Reserve).
  virtual void Reserve(int B, int T, int slots) = 0;
  virtual void ZeroGrad() = 0;
  // GPT::ForwardMicro with `input` a stage buffer (or nullptr on the first stage). The loss is
  // not returned: TakeLoss reads it, so a device backend need not wait for the forward here.
  virtual void ForwardMicro(int slot, const int* tokens, const void* input, const int* targets) = 0;
  // The mean cross-entropy of the slot's last forward (last stage, with targets), as a float
  // (the CPU model's rounding). May wait for the device.
  virtual float TakeLoss(int slot) = 0;
  // GPT::Output as a stage buffer.
  virtual const void* Output(int slot) const = 0;
  using GradReadyFn = std::function<void(int stage)>;
  // GPT::BackwardMicro with `doutput` a stage buffer (or nullptr on the last stage).
  virtual void BackwardMicro(int slot, float loss_scale, const void* doutput,
                             const GradReadyFn& ready) = 0;
  virtual const void* InputGrad() const = 0;  // GPT::InputGrad as a stage buffer

  // ---- stage buffers for the pipeline ----

  // A new stage buffer (B, T, C) of the Reserve'd shape, owned by the backend until it dies.
  virtual void* NewStageBuffer() = 0;
  // dst := src, both stage buffers (ordered after the work that wrote src).
  virtual void CopyStage(void* dst, const void* src) = 0;
  // A stage buffer's size in fp32 words (what Communicator::Send/Recv move) and in bytes.
  virtual size_t stage_floats() const = 0;
  size_t stage_bytes() const { return stage_floats() * sizeof(float); }
  // The bytes one tensor-parallel all-reduce of (B, T, C) moves here.
  virtual size_t tp_all_reduce_bytes() const = 0;

  // ---- collectives on host values ----

  // data (n, host) := its sum over `comm`, one of the groups this backend was built with (a
  // device backend's communicators move device buffers: it stages the values). Throws
  // CommError.
  virtual void AllReduceHost(Communicator* comm, float* data, size_t n) = 0;

  // ---- gradients and the optimizer ----

  // The data-parallel bucket all-reduce, or nullptr (one dp rank, or ZeRO-1).
  virtual GradSync* grad_sync() = 0;
  // Sums the tied embedding's gradient (wte) over `emb` (the first and last stage). Returns the
  // bytes moved. Throws CommError.
  virtual size_t SumEmbeddingGrad(Communicator* emb) = 0;
  // ZeRO-1 (shard with dp > 1 only): this rank's range of the dp group's gradient sum times
  // `scale`; returns the bytes. And after the update: every range of the parameters gathered.
  virtual size_t ZeroReduceScatter(float scale) = 0;
  virtual size_t ZeroGatherParams() = 0;
  // The part of the parameter-shaped buffer this rank updates: [begin, end) (its ZeRO-1 range,
  // or everything).
  virtual size_t update_begin() const = 0;
  virtual size_t update_end() const = 0;
  // The global gradient norm when this rank holds the whole world's gradients (one rank).
  virtual double GradNorm() = 0;
  // This rank's terms of the world's squared gradient norm: the sums of squares, in double, of
  // the owned tensors' gradients (TensorInfo::owner) within [update_begin, update_end), added
  // into parts (GradNormParts(layers) entries; GradNormPart says which). A part is summed the
  // same way whichever stage holds it, so on the CPU the world's norm (the parts added in index
  // order) does not depend on where the pipeline's stage boundaries lie: the doctor's re-split
  // continues the same loss curve bit for bit.
  virtual void OwnedGradSumSquares(double* parts) = 0;
  // Clips the update range's gradients to global norm max_norm (ClipGradients) and applies one
  // AdamW step at `lr` to the update range.
  virtual void ClipAndUpdate(double grad_norm, double max_norm, float lr) = 0;
  virtual int64_t optimizer_step() const = 0;

  // ---- state for checkpoints (host fp32, the table's layout) ----

  // Pointers valid until the next call of a non-const method: the parameters (num_params; on a
  // backend whose master weights are sharded by ZeRO-1, only [update_begin, update_end): take
  // the whole from GatherState), and the moments of [update_begin, update_end).
  struct HostState {
    const float* params = nullptr;
    const float* m = nullptr;
    const float* v = nullptr;
  };
  virtual HostState StateToHost() = 0;
  // ZeRO-1 (a dp collective): the whole buffer's moments gathered over the dp group into m and
  // v (num_params each), and into params the whole parameters where this backend shards its
  // master weights too (the GPU's); params is left empty where StateToHost's are whole (the
  // CPU's).
  virtual void GatherState(std::vector<float>* params, std::vector<float>* m,
                           std::vector<float>* v) = 0;
  // Replaces the parameters (num_params) and the moments (those of the update range; both
  // nullptr: zero) and sets the optimizer step.
  virtual void LoadState(const float* params, const float* m, const float* v,
                         int64_t optimizer_step) = 0;

  // ---- profiling ----

  // The step's phases (StepProfiler on the CPU; device events on a GPU).
  virtual void BeginStep() = 0;
  virtual void Enter(Phase phase) = 0;
  virtual StepTimes EndStep(int64_t tokens) = 0;
  virtual void set_block_costs(BlockCosts* costs) = 0;
  virtual void set_trace(TraceRecorder* trace) = 0;
  // Fills the memory fields of `r` (memory, peak, reserved, fragmentation, device allocations,
  // rss) and r->device. `extra_bytes`: what the trainer holds besides the backend.
  virtual void FillMemory(size_t extra_bytes, StepResult* r) = 0;
  virtual size_t bytes_allocated() const = 0;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_BACKEND_H_
