// CUDA streams and events for the training core (issue 5): owning wrappers, the conversions to
// the allocator's StreamId, and the pair of streams of a rank (compute and communication)
// ordered by events.
#ifndef LOOM_WORKER_TRAIN_DEVICE_CUDA_STREAM_H_
#define LOOM_WORKER_TRAIN_DEVICE_CUDA_STREAM_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "worker/train/device/device_memory.h"

namespace loom::train {

inline StreamId ToStreamId(cudaStream_t stream) {
  return static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(stream));
}
inline cudaStream_t ToCudaStream(StreamId id) {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(id));
}

// An owned stream that does not synchronise with the legacy default stream. Lives on the device
// current at construction. Not copyable or movable (handles are passed by get()).
class CudaStream {
 public:
  // priority: as cudaStreamCreateWithPriority (lower numbers run first; 0 is the default).
  explicit CudaStream(int priority = 0);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  StreamId id() const { return ToStreamId(stream_); }
  // Blocks the host until all work queued on the stream has finished.
  void Synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// An owned event. timing = false makes a lighter event (ordering and completion only).
class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Captures the work queued on `stream` so far.
  void Record(cudaStream_t stream);
  // True once the captured work has finished (or the event was never recorded). Never blocks.
  bool Done() const;
  // Blocks the host until the captured work has finished.
  void Synchronize() const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds of device time between two recorded timing events (end must have completed:
// call end.Synchronize() first).
float ElapsedMs(const CudaEvent& start, const CudaEvent& end);

// Makes work queued on `waiter` from now on wait for the work queued on `signaller` so far,
// without blocking the host, by recording `event` on the signaller. The event may be recorded
// again right after: the wait keeps the state of this record.
void StreamWaitStream(cudaStream_t waiter, cudaStream_t signaller, CudaEvent& event);

// The streams of one rank: compute (forward, backward, optimizer) and communication
// (collectives), so gradient all-reduces overlap backward. The communication stream has the
// higher priority so a ready collective is not starved by compute kernels.
// Threading: one thread drives both streams.
class ComputeCommStreams {
 public:
  ComputeCommStreams();
  cudaStream_t compute() const { return compute_.get(); }
  cudaStream_t comm() const { return comm_.get(); }

  // Collectives queued on the comm stream from now on start after the compute work queued so
  // far (e.g. after backward wrote a gradient bucket).
  void CommWaitsForCompute();
  // Compute work queued from now on starts after the collectives queued so far (e.g. the
  // optimizer after the last all-reduce).
  void ComputeWaitsForComm();
  // Blocks the host until both streams are idle.
  void Synchronize() const;

 private:
  CudaStream compute_;
  CudaStream comm_;
  CudaEvent compute_done_;
  CudaEvent comm_done_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_CUDA_STREAM_H_
