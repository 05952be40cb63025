// The CPU backend of the training core (backend.h): the fp32 model of model/gpt.h on host
// memory, AdamW over its range (optim/adamw.h), the data-parallel gradient buckets
// (parallel/grad_buckets.h) or ZeRO-1's range reduce-scatter and gather
// (parallel/zero_optimizer.h) over host communicators, and the steady-clock step profiler.
// Stage buffers are host float arrays; the parameter-shaped state is held in the table's layout,
// so the host views are the buffers themselves.
//
// Threading: the training thread only (backend.h).
#ifndef LOOM_WORKER_TRAIN_CPU_BACKEND_H_
#define LOOM_WORKER_TRAIN_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/backend.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/parallel/grad_buckets.h"
#include "worker/train/parallel/zero_optimizer.h"
#include "worker/train/profiler/step_profiler.h"

namespace loom::train {

struct CpuBackendOptions {
  AdamWConfig adam;
  // The rank's groups (not owned; outlive the backend). nullptr = a group of one. `tp` feeds the
  // model's tensor-parallel all-reduces; `dp` the gradient buckets, or ZeRO-1's range ops.
  Communicator* tp = nullptr;
  Communicator* dp = nullptr;
  bool zero1 = false;  // shard the optimizer state over dp (when dp has more than one rank)
  size_t bucket_bytes = kDefaultBucketBytes;
};

class CpuBackend : public Backend {
 public:
  // Builds the shard's model with GPT-2 initialisation from `seed`, and its optimizer.
  CpuBackend(const ModelDims& dims, const ModelShard& shard, uint64_t seed,
             const CpuBackendOptions& options);

  const ModelDims& dims() const override { return model_.dims(); }
  const ModelShard& shard() const override { return model_.shard(); }
  const std::vector<TensorInfo>& tensors() const override { return model_.tensors(); }
  size_t num_params() const override { return model_.num_params(); }
  std::string device_name() const override { return "cpu"; }

  void Reserve(int B, int T, int slots) override;
  void ZeroGrad() override { model_.ZeroGrad(); }
  void ForwardMicro(int slot, const int* tokens, const void* input, const int* targets) override;
  float TakeLoss(int slot) override { return losses_[slot]; }
  const void* Output(int slot) const override { return model_.Output(slot); }
  void BackwardMicro(int slot, float loss_scale, const void* doutput,
                     const GradReadyFn& ready) override;
  const void* InputGrad() const override { return model_.InputGrad(); }

  void* NewStageBuffer() override;
  void CopyStage(void* dst, const void* src) override;
  size_t stage_floats() const override { return stage_floats_; }
  size_t tp_all_reduce_bytes() const override { return stage_floats_ * sizeof(float); }

  void AllReduceHost(Communicator* comm, float* data, size_t n) override {
    comm->AllReduceSum(data, n)->Wait();
  }
  GradSync* grad_sync() override { return sync_.get(); }
  size_t SumEmbeddingGrad(Communicator* emb) override;
  size_t ZeroReduceScatter(float scale) override;
  size_t ZeroGatherParams() override;
  size_t update_begin() const override { return optimizer_.begin(); }
  size_t update_end() const override { return optimizer_.end(); }
  double GradNorm() override;
  void OwnedGradSumSquares(double* parts) override;
  void ClipAndUpdate(double grad_norm, double max_norm, float lr) override;
  int64_t optimizer_step() const override { return optimizer_.step(); }

  HostState StateToHost() override;
  void GatherState(std::vector<float>* params, std::vector<float>* m,
                   std::vector<float>* v) override;
  void LoadState(const float* params, const float* m, const float* v,
                 int64_t optimizer_step) override;

  void BeginStep() override { profiler_.BeginStep(); }
  void Enter(Phase phase) override { profiler_.Enter(phase); }
  StepTimes EndStep(int64_t tokens) override { return profiler_.EndStep(tokens); }
  void set_block_costs(BlockCosts* costs) override { model_.set_block_costs(costs); }
  void set_trace(TraceRecorder* trace) override { model_.set_trace(trace); }
  void FillMemory(size_t extra_bytes, StepResult* r) override;
  size_t bytes_allocated() const override;

  // The CPU's own objects, for what only the CPU does (llm.c import and export, tests).
  GPT& model() { return model_; }
  const GPT& model() const { return model_; }
  AdamW& optimizer() { return optimizer_; }

 private:
  GPT model_;
  AdamW optimizer_;
  std::unique_ptr<RangeGather> zero_;  // ZeRO-1 with dp > 1
  std::unique_ptr<GradSync> sync_;     // the buckets, with dp > 1 and no ZeRO-1
  StepProfiler profiler_;
  MemoryMeter memory_;
  size_t stage_floats_ = 0;                     // B * T * C of the Reserve'd shape
  std::vector<float> losses_;                   // (slots) each slot's last forward loss
  std::vector<std::vector<float>> stage_bufs_;  // NewStageBuffer's, (B, T, C) each
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CPU_BACKEND_H_
