// The CUDA backend of the training core (backend.h): GPT-2 in bf16 with fp32 master weights and
// AdamW moments on one device (model/gpt_cuda.h), its caching allocator and stream, the
// data-parallel gradient buckets over NCCL overlapped with backward (cuda_grad_sync.h), and
// device-event phase timing (device/cuda_phase_timer.h). The step loop is the CPU's
// (trainer.h); what differs is here.
//
// Layouts: any data x tensor x pipeline layout (the model holds the rank's ModelShard: its
// stage's blocks and its tensor-parallel slice, model/gpt_cuda.h). Stage buffers are bf16
// (B, T, C) device buffers, moved by the pipeline communicator as raw bytes (stage_floats() fp32
// words). ZeRO-1 (zero1 with dp > 1): the model holds the masters and moments of its dp rank's
// range only, and cuda_zero.h moves the gradients and parameters between the ranks.
//
// Communicators: the groups handed in are NcclCommunicators on this backend's device; the
// backend makes each one order its work after the model's stream (SetComputeStream).
// Host values (the trainer's world all-reduce of loss, norm and stop flag) are staged through a
// small device buffer.
//
// Threading: the training thread only (backend.h).
#ifndef LOOM_WORKER_TRAIN_CUDA_BACKEND_H_
#define LOOM_WORKER_TRAIN_CUDA_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/backend.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/cuda_zero.h"
#include "worker/train/device/cuda_phase_timer.h"
#include "worker/train/model/gpt_cuda.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/parallel/grad_buckets.h"
#include "worker/train/parallel/process_groups.h"

namespace loom::train {

class CudaGradSync;

struct CudaBackendOptions {
  AdamWConfig adam;
  int device = 0;
  // The rank's groups on `device` (not owned; outlive the backend); nullptr = a group of one.
  NcclCommunicator* world = nullptr;
  NcclCommunicator* dp = nullptr;
  NcclCommunicator* tp = nullptr;       // the model's tensor-parallel all-reduces
  NcclCommunicator* pp = nullptr;       // stage buffers (the trainer sends and receives them)
  NcclCommunicator* emb = nullptr;      // the tied embedding's gradient (first and last stage)
  NcclCommunicator* pp_grad = nullptr;  // the pipeline's gradient messages (ProcessGroups)
  size_t bucket_bytes = kDefaultBucketBytes;
  // ZeRO-1 over `dp` (size > 1) instead of the gradient buckets; the elements per rank of one
  // of its collectives (CudaZero::kDefaultPiece unless a test exercises the pieces).
  bool zero1 = false;
  size_t zero_piece = CudaZero::kDefaultPiece;
  // The fused attention kernels where the head size allows them (GptCuda's fused_attention).
  bool fused_attention = true;
};

class CudaBackend : public Backend {
 public:
  // Builds the shard's model on options.device with the CPU model's initialisation from `seed`
  // (every shard starts from its slice of the single-rank model). options.tp must be the tp
  // group when shard.tp_size > 1. Throws OutOfMemoryError when the device cannot hold it.
  CudaBackend(const ModelDims& dims, const ModelShard& shard, uint64_t seed,
              const CudaBackendOptions& options);
  ~CudaBackend() override;

  const ModelDims& dims() const override { return model_.dims(); }
  const ModelShard& shard() const override { return model_.shard(); }
  const std::vector<TensorInfo>& tensors() const override { return model_.tensors(); }
  size_t num_params() const override { return model_.num_params(); }
  std::string device_name() const override;

  void Reserve(int B, int T, int slots) override;
  void ZeroGrad() override { model_.ZeroGrad(); }
  void ForwardMicro(int slot, const int* tokens, const void* input, const int* targets) override;
  float TakeLoss(int slot) override;
  const void* Output(int slot) const override;
  void BackwardMicro(int slot, float loss_scale, const void* doutput,
                     const GradReadyFn& ready) override;
  const void* InputGrad() const override;

  void* NewStageBuffer() override;
  void CopyStage(void* dst, const void* src) override;
  size_t stage_floats() const override { return stage_floats_; }
  size_t tp_all_reduce_bytes() const override;

  void AllReduceHost(Communicator* comm, float* data, size_t n) override;
  GradSync* grad_sync() override { return sync_.get(); }
  size_t SumEmbeddingGrad(Communicator* emb) override;
  size_t ZeroReduceScatter(float scale) override;
  size_t ZeroGatherParams() override;
  size_t update_begin() const override { return model_.range_begin(); }
  size_t update_end() const override { return model_.range_end(); }
  double GradNorm() override { return model_.GradNorm(); }  // one rank: every tensor owned
  void OwnedGradSumSquares(double* parts) override;
  void ClipAndUpdate(double grad_norm, double max_norm, float lr) override;
  int64_t optimizer_step() const override { return optimizer_step_; }

  HostState StateToHost() override;
  void GatherState(std::vector<float>* params, std::vector<float>* m,
                   std::vector<float>* v) override;
  void LoadState(const float* params, const float* m, const float* v,
                 int64_t optimizer_step) override;

  void BeginStep() override;
  void Enter(Phase phase) override { timer_.Enter(phase); }
  StepTimes EndStep(int64_t tokens) override;
  void set_block_costs(BlockCosts* costs) override { model_.set_block_costs(costs); }
  void set_trace(TraceRecorder* trace) override { (void)trace; }
  void FillMemory(size_t extra_bytes, StepResult* r) override;
  size_t bytes_allocated() const override;

  GptCuda& model() { return model_; }
  const GptCuda& model() const { return model_; }

  // The floats of the staging buffer for AllReduceHost (larger sums go in pieces); allocated
  // at construction, before Reserve (the planner's memory model mirrors it).
  static constexpr size_t kHostScalars = 16;

 private:
  size_t stage_bytes_exact() const;  // B * T * C bf16: what a stage buffer carries
  CudaBackendOptions options_;
  GptCuda model_;
  CudaPhaseTimer timer_;
  std::unique_ptr<GradSync> sync_;  // dp > 1 without ZeRO-1
  std::unique_ptr<CudaZero> zero_;  // dp > 1 with ZeRO-1
  int64_t optimizer_step_ = 0;      // AdamW's step count (bias correction)
  int dp_size_ = 1;
  float* host_scalars_ = nullptr;  // (kHostScalars) fp32 device staging for AllReduceHost
  GptCuda::HostState host_state_;  // StateToHost's copy
  size_t stage_floats_ = 0;        // ceil(B * T * C / 2): a bf16 stage buffer in fp32 words
  std::vector<void*> stage_bufs_;  // NewStageBuffer's, freed in the destructor
  std::chrono::steady_clock::time_point step_start_{};
  // StepResult::device_allocations: the allocator's growth since the previous step; a growth
  // after the first kAllocFreeAfterSteps steps breaks the allocation-free steady state and is
  // warned about on stderr once.
  static constexpr int64_t kAllocFreeAfterSteps = 2;
  uint64_t allocs_seen_ = 0;
  int64_t steps_seen_ = 0;
  bool alloc_warned_ = false;
};

// The CudaBackendFactory of the CUDA build (run.h, RunOptions::cuda_backend): checks that
// `device` exists (InputError otherwise, before connecting), connects the rank's NCCL groups of
// more than one rank (a build without NCCL refuses them: InputError), and builds the backend for
// the rank's shard.
std::unique_ptr<Backend> MakeCudaRankBackend(const JobConfig& config, const BatchShape& shape,
                                             int device, const RendezvousConfig& rendezvous,
                                             size_t bucket_bytes, ProcessGroups* groups);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CUDA_BACKEND_H_
