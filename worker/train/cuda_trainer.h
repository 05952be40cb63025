// The training loop on one CUDA device (issue 5): GptCuda in bf16 mixed precision, K
// micro-batches of gradient accumulation per step, the global gradient norm and clipping, AdamW
// on the fp32 master weights at the CPU trainer's learning-rate schedule. The data is the CPU
// trainer's (the same BatchSampler: same seed, same micro-batches in the same order), so the two
// loss curves agree within bf16's tolerance (DESIGN.md: a few percent over 50 steps).
//
// Phase times are device time between CUDA events on the model's stream (CudaPhaseTimer), with
// an NVTX range per phase; memory is the caching allocator's (allocated and peak) plus the
// GEMM workspace.
//
// Checkpoints hold the fp32 master weights and moments in the CPU trainer's format
// (cuda_trainer_checkpoint.cc), so a job moves between the CPU and the GPU through them.
//
// Data parallelism (dp > 1, tp = pp = 1; built only with NCCL): each rank trains its own
// micro-batches of the global batch (the BatchSampler of its dp rank, as the CPU trainer), the
// last micro-batch's backward drives the bucketed NCCL all-reduce of the bf16 gradients,
// overlapped with the rest of backward (cuda_grad_sync.h); the mean over dp comes from the loss
// scale 1/(K * dp). The loss is averaged over dp (an fp32 all-reduce), the gradient norm is
// taken after the sum (the same on every rank), and the compute stream's wait for the buckets
// is the step's comm_exposed phase. Checkpoints: dp rank 0 writes, then every rank meets.
//
// Not yet on the GPU path: tensor and pipeline parallelism, ZeRO-1, llm.c import/export (run.cc
// refuses them with --device cuda).
#ifndef LOOM_WORKER_TRAIN_CUDA_TRAINER_H_
#define LOOM_WORKER_TRAIN_CUDA_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/device/cuda_phase_timer.h"
#include "worker/train/device_trainer.h"
#include "worker/train/model/gpt_cuda.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/parallel/grad_buckets.h"

namespace loom::train {

// cuda_grad_sync.h, built only with NCCL; the deleter is defined where the class is complete.
class CudaGradSync;
struct CudaGradSyncDeleter {
  void operator()(CudaGradSync* sync) const;
};

class CudaTrainer : public DeviceTrainer {
 public:
  // The whole model on `device`, initialised as the CPU trainer's (config.seed). `data` must
  // outlive the trainer. Requires shape.tp_size = pp_size = 1, and shape.dp_size = 1 or `dp`:
  // the data-parallel group of shape.dp_size ranks on `device` (NCCL; owned from here on), whose
  // gradients go in buckets of `bucket_bytes`, overlapped with backward when dp_overlap (checked).
  CudaTrainer(const JobConfig& config, const BatchShape& shape, const Dataset& data, int device,
              std::unique_ptr<NcclCommunicator> dp = nullptr,
              size_t bucket_bytes = kDefaultBucketBytes, bool dp_overlap = true);
  ~CudaTrainer() override;

  StepResult Step() override;
  float Evaluate() override;
  int64_t step() const override { return step_; }
  size_t num_params() const override { return model_.num_params(); }
  std::string Save(const std::string& root, int64_t generation) override;
  CheckpointMeta Resume(const std::string& dir) override;
  // An NCCL all-gather over dp (fp32: steps exact below 2^24).
  std::vector<int64_t> GatherResumeSteps(int64_t step) override;
  // Each step's phases as the CUDA events measured them (data, forward and backward per
  // micro-batch, the wait for the buckets, the optimizer), placed on the host's clock by the
  // step's first event, recorded when the stream is idle (the previous step synchronised).
  void set_trace(TraceRecorder* trace) override { trace_ = trace; }
  GptCuda& model() { return model_; }
  size_t num_buckets() const;  // the data-parallel gradient buckets (0 without dp)

  static constexpr int kMaxEvalBatches = 32;  // as Trainer::kMaxEvalBatches

 private:
  // The step's CUDA-event spans (timer_.spans()) as trace records, from the steady instant
  // `step_start` at which the step's first event was recorded.
  void RecordTimeline(int64_t step_start);
  JobConfig config_;
  BatchShape shape_;
  GptCuda model_;  // before timer_: it selects the device and creates the stream
  AdamWConfig adam_;
  LrSchedule schedule_;
  BatchSampler sampler_;
  EvalBatches eval_batches_;
  CudaPhaseTimer timer_;
  // Data parallelism (dp > 1): the group, then the buckets over it (destroyed first).
  std::unique_ptr<NcclCommunicator> dp_;
  std::unique_ptr<CudaGradSync, CudaGradSyncDeleter> sync_;
  bool dp_overlap_ = true;
  std::vector<int> inputs_;   // (B, T) host
  std::vector<int> targets_;  // (B, T) host
  int64_t step_ = 0;          // completed optimizer steps
  TraceRecorder* trace_ = nullptr;
  // AdamW's step count (bias correction): step_, unless a resumed checkpoint says otherwise.
  int64_t optimizer_step_ = 0;
  // StepResult::device_allocations is the growth of the allocator's num_device_allocs since the
  // previous Step of this trainer; a growth after its first kAllocFreeAfterSteps steps breaks the
  // allocation-free steady state and is warned about on stderr once.
  struct DeviceAllocWatch {
    static constexpr int64_t kAllocFreeAfterSteps = 2;
    uint64_t seen = 0;  // num_device_allocs at the end of the previous Step (0 before the first)
    int64_t steps = 0;  // Steps taken by this trainer (not step_: a resumed run starts later)
    bool warned = false;
  } alloc_watch_;
};

// The DeviceTrainerFactory of the CUDA build (RunOptions::cuda_trainer): checks that `device`
// exists (InputError otherwise); with shape.dp_size > 1 refuses a build without NCCL
// (InputError), opens the rendezvous store (OpenRendezvousStore) and connects the NCCL group
// "dp" on `device` within options.rendezvous.timeout (CommError otherwise); then builds a
// CudaTrainer.
std::unique_ptr<DeviceTrainer> MakeCudaTrainer(const JobConfig& config, const BatchShape& shape,
                                               const Dataset& data, int device,
                                               const DeviceTrainerOptions& options = {});

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CUDA_TRAINER_H_
