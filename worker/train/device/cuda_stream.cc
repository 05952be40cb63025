#include "worker/train/device/cuda_stream.h"

#include "worker/train/device/cuda_check.h"

namespace loom::train {

CudaStream::CudaStream(int priority) {
  LOOM_TRAIN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

CudaStream::~CudaStream() { cudaStreamDestroy(stream_); }

void CudaStream::Synchronize() const { LOOM_TRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

CudaEvent::CudaEvent(bool timing) {
  LOOM_TRAIN_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() { cudaEventDestroy(event_); }

void CudaEvent::Record(cudaStream_t stream) {
  LOOM_TRAIN_CUDA_CHECK(cudaEventRecord(event_, stream));
}

bool CudaEvent::Done() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LOOM_TRAIN_CUDA_CHECK(err);
  return true;
}

void CudaEvent::Synchronize() const { LOOM_TRAIN_CUDA_CHECK(cudaEventSynchronize(event_)); }

float ElapsedMs(const CudaEvent& start, const CudaEvent& end) {
  float ms = 0.0f;
  LOOM_TRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), end.get()));
  return ms;
}

void StreamWaitStream(cudaStream_t waiter, cudaStream_t signaller, CudaEvent& event) {
  event.Record(signaller);
  LOOM_TRAIN_CUDA_CHECK(cudaStreamWaitEvent(waiter, event.get(), 0));
}

namespace {

// The greatest (most urgent) priority of the current device.
int HighestPriority() {
  int least = 0;
  int greatest = 0;
  LOOM_TRAIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

}  // namespace

ComputeCommStreams::ComputeCommStreams() : compute_(0), comm_(HighestPriority()) {}

void ComputeCommStreams::CommWaitsForCompute() {
  StreamWaitStream(comm_.get(), compute_.get(), compute_done_);
}

void ComputeCommStreams::ComputeWaitsForComm() {
  StreamWaitStream(compute_.get(), comm_.get(), comm_done_);
}

void ComputeCommStreams::Synchronize() const {
  compute_.Synchronize();
  comm_.Synchronize();
}

}  // namespace loom::train
