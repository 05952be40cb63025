// CudaTrainer's checkpoints: the fp32 master weights and AdamW moments, copied to the host in the
// table's layout and written as one shard in the CPU trainer's format (checkpoint.h), so a job
// saved on a GPU resumes on a CPU and the other way round, under any layout the checkpoint code
// can re-slice. The bf16 parameters are not saved: they are re-derived from the masters. Under
// data parallelism dp rank 0 writes (the ranks hold the same state) and every rank loads.
#include <string>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/cuda_trainer.h"
#include "worker/train/device/nvtx_range.h"

namespace loom::train {

std::string CudaTrainer::Save(const std::string& root, int64_t generation) {
  NvtxRange range("checkpoint");
  CheckpointMeta meta = MetaOf(shape_, model_.dims(), config_.seed, step_, generation);
  meta.zero1 = false;
  meta.optimizer_step = optimizer_step_;
  if (!dp_) {
    const GptCuda::HostState state = model_.StateToHost();
    return SaveCheckpoint(root, model_.tensors(), state.params.data(), state.m.data(),
                          state.v.data(), meta);
  }
  // Data parallelism: every rank holds the same state, so dp rank 0 writes the one shard and
  // publishes it; then every rank meets, so that nobody goes on (or reads the checkpoint, or
  // crashes and restarts from an older one) before it exists. A failed write on rank 0 throws
  // there; the others then fail the barrier at the communicator's timeout (CommError).
  std::string dir = root + "/" + CheckpointDirName(step_);
  if (shape_.dp_rank == 0) {
    const GptCuda::HostState state = model_.StateToHost();
    dir = SaveCheckpoint(root, model_.tensors(), state.params.data(), state.m.data(),
                         state.v.data(), meta);
  }
  dp_->Barrier()->Wait();
  return dir;
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
