#include "worker/train/cuda_grad_sync.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/check.h"
#include "worker/train/device/cuda_stream.h"
#include "worker/train/error.h"
#include "worker/train/model/padded_layout.h"

namespace loom::train {
namespace {

using bf16 = GptCuda::bf16;

// Milliseconds from `a` to `b` (both complete), as seconds.
double SecondsBetween(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return static_cast<double>(ms) / 1e3;
}

}  // namespace

CudaGradSync::CudaGradSync(GptCuda* model, NcclCommunicator* comm, size_t bucket_bytes)
    : model_(model), comm_(comm), compute_(model->stream()) {
  LOOM_CHECK(model != nullptr && comm != nullptr, "CudaGradSync needs a model and a communicator");
  int device = -1;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));  // the model's: GptCuda selected it on this thread
  LOOM_CHECK(comm->device() == device, "the communicator is on device " +
                                           std::to_string(comm->device()) + ", the model on " +
                                           std::to_string(device));
  comm_->SetComputeStream(compute_);
  // The CPU's plan, in bf16 elements, moved onto the padded device layout.
  const std::vector<TensorInfo>& table = model->tensors();
  const PaddedLayout& layout = model->layout();
  const std::vector<GradBucketPlan> plan = ToPaddedLayout(
      PlanGradBuckets(table, model->dims().layers, bucket_bytes, sizeof(bf16)), table, layout);
  CachingAllocator* allocator = model->allocator();
  const StreamId comm_stream = ToStreamId(comm->stream());
  buckets_.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Bucket& b = buckets_[i];
    b.pieces = plan[i].pieces;
    b.last_stage = plan[i].last_stage;
    b.numel = plan[i].numel;
    total_ += b.numel;
    // Allocated for the compute stream (the packing and unpacking); the all-reduce uses it on
    // the communication stream, which the allocator must wait for when it is freed.
    b.buffer =
        static_cast<bf16*>(allocator->Allocate(b.numel * sizeof(bf16), ToStreamId(compute_)));
    allocator->RecordStream(b.buffer, comm_stream);
    LOOM_CUDA_CHECK(cudaEventCreate(&b.packed));
    LOOM_CUDA_CHECK(cudaEventCreate(&b.done));
  }
  scalar_ = static_cast<float*>(allocator->Allocate(sizeof(float), ToStreamId(compute_)));
  allocator->RecordStream(scalar_, comm_stream);
  // Pinned, so that neither copy of the scalar synchronises with the compute stream on the
  // host (a pageable copy may, and would block on a hung collective outside the watchdog).
  LOOM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&scalar_host_), 2 * sizeof(float)));
  LOOM_CUDA_CHECK(cudaEventCreate(&wait_begin_));
  LOOM_CUDA_CHECK(cudaEventCreate(&wait_end_));
}

CudaGradSync::~CudaGradSync() {
  // The allocator's stream records keep the buffers from reuse until the queued work is done;
  // the events may be destroyed while pending (CUDA releases them once they complete).
  CachingAllocator* allocator = model_->allocator();
  for (Bucket& b : buckets_) {
    allocator->Free(b.buffer);
    cudaEventDestroy(b.packed);
    cudaEventDestroy(b.done);
  }
  allocator->Free(scalar_);
  if (scalar_host_ != nullptr) {
    cudaStreamSynchronize(compute_);  // a pending copy may still touch it
    cudaFreeHost(scalar_host_);
  }
  cudaEventDestroy(wait_begin_);
  cudaEventDestroy(wait_end_);
}

void CudaGradSync::Begin() {
  LOOM_CHECK(!begun_, "Begin while a step is being reduced");
  begun_ = true;
  next_ = 0;
  for (Bucket& b : buckets_) b.work.reset();
  scalar_work_.reset();
}

void CudaGradSync::Launch(Bucket& b) {
  bf16* grads = model_->grads();
  bf16* dst = b.buffer;
  // On the compute stream, behind the backward kernels that wrote these gradients. The buffer's
  // previous all-reduce finished before the previous step's unpack (StreamWaitAll), which this
  // stream ran before these copies.
  for (const GradPiece& p : b.pieces) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, grads + p.offset, p.numel * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, compute_));
    dst += p.numel;
  }
  LOOM_CUDA_CHECK(cudaEventRecord(b.packed, compute_));
  // The communicator makes its stream wait for the compute stream's work so far (the copies).
  b.work = comm_->AllReduceSum(b.buffer, b.numel, DeviceDType::kBFloat16);
  // Issued from this thread only, so nothing else lands on the communication stream between
  // the all-reduce and this event.
  LOOM_CUDA_CHECK(cudaEventRecord(b.done, comm_->stream()));
}

void CudaGradSync::StageReady(int stage) {
  LOOM_CHECK(begun_, "StageReady before Begin");
  while (next_ < buckets_.size() && buckets_[next_].last_stage >= stage) {
    Launch(buckets_[next_++]);
  }
}

void CudaGradSync::Finish() {
  StageReady(-1);  // a backward without the hook (--dp-overlap false) issues everything here
  LOOM_CUDA_CHECK(cudaEventRecord(wait_begin_, compute_));
  comm_->StreamWaitAll(compute_);
  LOOM_CUDA_CHECK(cudaEventRecord(wait_end_, compute_));
  // The sums back into the gradients, on the compute stream: the optimizer and the gradient
  // norm read them there. Already the mean (the 1/(K * dp) loss scale).
  bf16* grads = model_->grads();
  for (const Bucket& b : buckets_) {
    const bf16* src = b.buffer;
    for (const GradPiece& p : b.pieces) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(grads + p.offset, src, p.numel * sizeof(bf16),
                                      cudaMemcpyDeviceToDevice, compute_));
      src += p.numel;
    }
  }
  begun_ = false;
}

void CudaGradSync::StartScalarSum(float value) {
  // Read by the copy when the stream runs it; written again only after WaitHost synchronised.
  scalar_host_[0] = value;
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(scalar_, scalar_host_, sizeof(float), cudaMemcpyHostToDevice, compute_));
  scalar_work_ = comm_->AllReduceSum(scalar_, 1);
}

float CudaGradSync::WaitHost() {
  // First on the host, through the communicator's watchdog: a failed or hung collective throws
  // here rather than leaving the compute stream (and a synchronise on it) waiting forever.
  for (Bucket& b : buckets_) {
    if (b.work) b.work->Wait();
  }
  if (scalar_work_) scalar_work_->Wait();
  // Done on the device; the compute stream still has to be ordered after the scalar's sum
  // before it copies it back.
  comm_->StreamWaitAll(compute_);
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(scalar_host_ + 1, scalar_, sizeof(float), cudaMemcpyDeviceToHost, compute_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return scalar_host_[1];
}

double CudaGradSync::comm_seconds() const {
  // The communication stream runs the buckets in issue order: each one began when it was
  // packed or when the one before finished, whichever was later.
  double busy = 0.0;
  const Bucket* previous = nullptr;
  for (const Bucket& b : buckets_) {
    if (!b.work) continue;
    LOOM_CUDA_CHECK(cudaEventSynchronize(b.done));
    // done - max(packed, previous done) = min(done - packed, done - previous done).
    double span = SecondsBetween(b.packed, b.done);
    if (previous != nullptr) span = std::min(span, SecondsBetween(previous->done, b.done));
    busy += std::max(span, 0.0);
    previous = &b;
  }
  return busy;
}

double CudaGradSync::wait_seconds() const {
  LOOM_CUDA_CHECK(cudaEventSynchronize(wait_end_));
  return std::max(SecondsBetween(wait_begin_, wait_end_), 0.0);
}

}  // namespace loom::train
