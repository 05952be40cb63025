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
// Not yet on the GPU path: data/tensor/pipeline parallelism, llm.c import/export (run.cc
// refuses them with --device cuda).
#ifndef LOOM_WORKER_TRAIN_CUDA_TRAINER_H_
#define LOOM_WORKER_TRAIN_CUDA_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/device/cuda_phase_timer.h"
#include "worker/train/device_trainer.h"
#include "worker/train/model/gpt_cuda.h"
#include "worker/train/optim/adamw.h"

namespace loom::train {

class CudaTrainer : public DeviceTrainer {
 public:
  // The whole model on `device`, initialised as the CPU trainer's (config.seed). `data` must
  // outlive the trainer. Requires shape.dp_size = tp_size = pp_size = 1 (checked).
  CudaTrainer(const JobConfig& config, const BatchShape& shape, const Dataset& data, int device);

  StepResult Step() override;
  float Evaluate() override;
  int64_t step() const override { return step_; }
  size_t num_params() const override { return model_.num_params(); }
  std::string Save(const std::string& root, int64_t generation) override;
  CheckpointMeta Resume(const std::string& dir) override;
  GptCuda& model() { return model_; }

  static constexpr int kMaxEvalBatches = 32;  // as Trainer::kMaxEvalBatches

 private:
  JobConfig config_;
  BatchShape shape_;
  GptCuda model_;  // before timer_: it selects the device and creates the stream
  AdamWConfig adam_;
  LrSchedule schedule_;
  BatchSampler sampler_;
  EvalBatches eval_batches_;
  CudaPhaseTimer timer_;
  std::vector<int> inputs_;   // (B, T) host
  std::vector<int> targets_;  // (B, T) host
  int64_t step_ = 0;          // completed optimizer steps
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
// exists (InputError otherwise), then builds a CudaTrainer.
std::unique_ptr<DeviceTrainer> MakeCudaTrainer(const JobConfig& config, const BatchShape& shape,
                                               const Dataset& data, int device);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CUDA_TRAINER_H_
