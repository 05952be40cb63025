// CudaTrainer's checkpoints: the fp32 master weights and AdamW moments, copied to the host in the
// table's layout and written as one shard in the CPU trainer's format (checkpoint.h), so a job
// saved on a GPU resumes on a CPU and the other way round, under any layout the checkpoint code
// can re-slice. The bf16 parameters are not saved: they are re-derived from the masters.
#include <string>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/cuda_trainer.h"
#include "worker/train/device/nvtx_range.h"

namespace loom::train {

std::string CudaTrainer::Save(const std::string& root, int64_t generation) {
  NvtxRange range("checkpoint");
  CheckpointMeta meta;
  meta.step = step_;
  meta.seed = config_.seed;
  meta.generation = generation;
  meta.B = shape_.B;
  meta.T = shape_.T;
  meta.K = shape_.K;
  meta.dp_size = meta.tp_size = meta.pp_size = 1;
  meta.blocks_per_stage = {config_.model.layers};
  meta.zero1 = false;
  meta.dims = model_.dims();
  meta.optimizer_step = optimizer_step_;
  const GptCuda::HostState state = model_.StateToHost();
  return SaveCheckpoint(root, model_.tensors(), state.params.data(), state.m.data(),
                        state.v.data(), meta);
}

CheckpointMeta CudaTrainer::Resume(const std::string& dir) {
  NvtxRange range("resume");
  const size_t n = model_.num_params();
  std::vector<float> params(n), m(n), v(n);
  CheckpointMeta meta = LoadShardedCheckpoint(dir, model_.dims(), model_.tensors(), params.data(),
                                              m.data(), v.data());
  model_.LoadState(params.data(), m.data(), v.data());
  optimizer_step_ = meta.optimizer_step >= 0 ? meta.optimizer_step : meta.step;
  step_ = meta.step;
  return meta;
}

}  // namespace loom::train
