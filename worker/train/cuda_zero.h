// ZeRO-1 on the GPU (DESIGN.md, "DP"; the CPU's is parallel/zero_optimizer.h): the optimizer
// state is sharded over the data-parallel ranks. Each dp rank's GptCuda holds the fp32 master
// weights and AdamW moments of one range of the shard's table only (GptCuda::MasterRange), the
// CPU's range (ZeroRangeOf over the table, so a checkpoint's moments split the same way on both
// devices). A step:
//   1. ReduceScatter: the bf16 gradients are summed over dp so that each rank receives the sum
//      of its range (written back into the model's gradient buffer at the range's places);
//   2. the model's Update runs AdamW on the range (GptCuda::Update);
//   3. GatherParams: every rank's range of the bf16 parameters is all-gathered into every
//      rank's parameter buffer.
// The ranges tile the table padded to dp * shard elements; the collectives move it in pieces of
// at most `piece` elements per rank through one staging buffer, each piece laid out rank by rank
// (NCCL's reduce-scatter and all-gather take equal blocks in rank order), copied from and to the
// padded device layout with GptCuda::ForEachSpan. Traffic: one reduce-scatter and one
// all-gather of the bf16 table, as much as the bucketed all-reduce of plain data parallelism;
// memory: 12 bytes per parameter of optimizer state become 12 / dp, plus the staging buffer.
//
// Checkpoints: GatherState brings every rank's masters and moments to the host of every dp rank
// (fp32 all-gathers, in pieces): the writer saves the same tensors as an unsharded run.
//
// Threading: the training thread. Every call blocks the host until its collectives completed
// (through the communicator's watchdog: a dead peer is a CommError, not a hang).
#ifndef LOOM_WORKER_TRAIN_CUDA_ZERO_H_
#define LOOM_WORKER_TRAIN_CUDA_ZERO_H_

#include <cstddef>
#include <vector>

#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/model/gpt_cuda.h"
#include "worker/train/parallel/zero_optimizer.h"

namespace loom::train {

class CudaZero {
 public:
  // The default piece: 1 Mi elements per rank (the staging buffer is (dp + 1) * piece fp32).
  static constexpr size_t kDefaultPiece = size_t{1} << 20;

  // The range of dp rank `rank` of `size` over a table of n parameters (the CPU's ZeroRangeOf):
  // what the model's MasterRange must be.
  static ZeroRange RangeOf(size_t n, int size, int rank) { return ZeroRangeOf(n, size, rank); }

  // `model` holds RangeOf(model->num_params(), dp->size(), dp->rank()) as its master range;
  // `dp` is the data-parallel group on the model's device (size > 1). Both outlive this.
  // piece > 0: the elements per rank moved by one collective (tests choose small ones to
  // exercise the pieces). Allocates the staging buffer from the model's allocator.
  CudaZero(GptCuda* model, NcclCommunicator* dp, size_t piece = kDefaultPiece);
  ~CudaZero();
  CudaZero(const CudaZero&) = delete;
  CudaZero& operator=(const CudaZero&) = delete;

  // The model's gradients in this rank's range := their sum over the dp group (the rest of the
  // gradient buffer is left as it was). Returns the bytes this rank handed in (the padded
  // table in bf16: what an all-reduce of the same gradients is counted at). Throws CommError.
  size_t ReduceScatter();
  // Every rank's range of the model's bf16 parameters from its owner. Returns the bytes
  // gathered. Throws CommError.
  size_t GatherParams();
  // params, m, v (num_params each, the table's layout) := every rank's masters and moments, on
  // the host. A dp collective: every dp rank calls it. Throws CommError.
  void GatherState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v);

  const ZeroRange& range() const { return range_; }
  size_t staging_bytes() const { return staging_bytes_; }

 private:
  // Copies table range [lo, lo + n) of a padded-layout bf16 buffer to or from a contiguous one
  // (elements past the table: zero when gathering into `flat`, skipped when scattering).
  void ToFlat(const GptCuda::bf16* padded, size_t lo, size_t n, GptCuda::bf16* flat);
  void FromFlat(const GptCuda::bf16* flat, size_t lo, size_t n, GptCuda::bf16* padded);
  // Gathers this rank's `local` (its range, fp32 on the device) into out (num_params, host).
  void GatherF32(const float* local, std::vector<float>* out);

  GptCuda* model_;
  NcclCommunicator* dp_;
  ZeroRange range_;
  size_t piece_;             // elements per rank per collective: min(piece, shard)
  void* staging_ = nullptr;  // (dp + 1) * piece_ fp32 (or bf16) elements
  size_t staging_bytes_ = 0;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CUDA_ZERO_H_
