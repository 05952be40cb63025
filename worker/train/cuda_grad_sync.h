// Data-parallel gradient reduction on the GPU over NCCL, overlapped with backward (DESIGN.md,
// "DP"): the GPU counterpart of parallel/grad_buckets.h, with the same buckets
// (PlanGradBuckets, mapped onto the model's padded device layout by ToPaddedLayout: wte whole
// with its zero padding rows, every other tensor shifted by the padding).
//
// Per step, for the LAST micro-batch's backward (earlier micro-batches accumulate locally):
//   - StageReady(stage), GptCuda's GradReadyFn: each bucket whose pieces are all final is packed
//     into its bf16 buffer by device-to-device copies on the compute stream, right behind the
//     kernels that wrote them, and its NCCL bf16 sum is issued; the communicator orders it after
//     the compute stream's work (an event), on its own stream, so it runs while backward goes on.
//   - Finish(): packs and issues what is left, makes the compute stream wait for every bucket
//     (on the device: the host does not block) and unpacks the sums into the gradients there.
//   - WaitHost(): blocks the host until the collectives have completed, so that a dead or hung
//     peer ends in CommError within the communicator's timeout instead of a host that waits
//     forever for the compute stream.
//
// The mean over the group: the sum of the ranks' gradients is their mean because each rank's
// backward ran with loss scale 1/(K * dp) (CudaBackend::BackwardMicro), so nothing is rescaled
// here. The sum is of bf16 values (rounded after each reduction step inside NCCL): within bf16's
// tolerance of the one-GPU gradients, not bit-identical to them.
//
// Memory: one bf16 buffer per bucket (a gradient-sized total, plus wte's padding) from the
// model's caching allocator at construction; the steady state allocates nothing.
//
// Timing (after the step's compute stream has synchronised): comm_seconds() is the device time
// the buckets kept the communication stream busy (sum over buckets of done - max(packed,
// previous done), from CUDA events); wait_seconds() is the device time the compute stream
// stalled on them after backward (the exposed part). overlap ratio = 1 - wait / comm.
//
// Built only with NCCL (LOOM_HAVE_NCCL); the CUDA backend refuses dp > 1 without it.
// Threading: every method on the training thread (the one driving the compute stream).
#ifndef LOOM_WORKER_TRAIN_CUDA_GRAD_SYNC_H_
#define LOOM_WORKER_TRAIN_CUDA_GRAD_SYNC_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "worker/train/comm/communicator.h"
#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/model/gpt_cuda.h"
#include "worker/train/parallel/grad_buckets.h"

namespace loom::train {

class CudaGradSync {
 public:
  // `model` and `comm` (the data-parallel group, on the model's device) outlive this. Sets the
  // communicator's compute stream to the model's. Throws OutOfMemoryError when the buckets do
  // not fit.
  CudaGradSync(GptCuda* model, NcclCommunicator* comm, size_t bucket_bytes);
  ~CudaGradSync();
  CudaGradSync(const CudaGradSync&) = delete;
  CudaGradSync& operator=(const CudaGradSync&) = delete;

  // Starts a step's reduction; nothing is issued yet.
  void Begin();
  // The GradReadyFn of the step's last Backward: packs and issues the buckets now final.
  void StageReady(int stage);
  // Issues what is left, then enqueues on the compute stream the wait for every bucket and the
  // unpacking of the sums into the gradients. Does not block the host.
  void Finish();
  // Issues the fp32 sum over the group of `value` (a tiny device buffer), ordered after the
  // compute stream's work so far.
  void StartScalarSum(float value);
  // Blocks the host until every collective issued this step has completed (CommError when one
  // failed or timed out), then returns the scalar sum (synchronises the compute stream).
  float WaitHost();

  // Device-time measurements of the last step; valid after WaitHost.
  double comm_seconds() const;
  double wait_seconds() const;

  size_t num_buckets() const { return buckets_.size(); }
  // Bytes all-reduced per step (bf16, including wte's padding rows).
  size_t bytes_per_step() const { return total_ * sizeof(GptCuda::bf16); }

 private:
  struct Bucket {
    std::vector<GradPiece> pieces;    // padded device layout, in backward order
    int last_stage = 0;               // issued once this stage is final
    size_t numel = 0;                 // sum of the pieces' numel
    GptCuda::bf16* buffer = nullptr;  // (numel) bf16, packed
    cudaEvent_t packed = nullptr;     // compute stream, after the pack copies
    cudaEvent_t done = nullptr;       // communication stream, after the all-reduce
    WorkHandle work;                  // set once issued this step
  };
  void Launch(Bucket& b);

  GptCuda* model_;
  NcclCommunicator* comm_;
  cudaStream_t compute_;
  std::vector<Bucket> buckets_;  // in launch order
  size_t total_ = 0;             // elements over all buckets: the padded buffer's length
  size_t next_ = 0;              // the first bucket not issued this step
  bool begun_ = false;
  float* scalar_ = nullptr;       // (1) fp32 device
  float* scalar_host_ = nullptr;  // (2) pinned host: [0] sent, [1] received
  WorkHandle scalar_work_;
  cudaEvent_t wait_begin_ = nullptr;  // compute stream, before the wait for the buckets
  cudaEvent_t wait_end_ = nullptr;    // compute stream, after it
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CUDA_GRAD_SYNC_H_
