// CudaMemory: DeviceMemory over the CUDA runtime (cudaMalloc/cudaFree and pooled CUDA events),
// the backend of the CachingAllocator on a GPU.
#ifndef LOOM_WORKER_TRAIN_DEVICE_CUDA_MEMORY_H_
#define LOOM_WORKER_TRAIN_DEVICE_CUDA_MEMORY_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "worker/train/device/device_memory.h"

namespace loom::train {

// Threading: not synchronised itself; the CachingAllocator serialises its calls. All memory and
// events belong to the device that was current (cudaSetDevice) when the object was constructed;
// callers keep that device current while using it.
class CudaMemory : public DeviceMemory {
 public:
  CudaMemory() = default;
  // Destroys the pooled events. Memory still allocated is the owner's to free first.
  ~CudaMemory() override;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  // cudaMalloc; nullptr on cudaErrorMemoryAllocation (the error is cleared), crash otherwise.
  void* Allocate(size_t bytes) override;
  // cudaFree, which waits for the device to finish work that may use the range.
  void Free(void* ptr) override;
  // Records a timing-free event from the pool (created on demand) on the stream.
  EventId RecordEvent(StreamId stream) override;
  // cudaEventQuery: true on success, false when not ready, crash on any other error.
  bool EventDone(EventId event) override;
  // Returns the event to the pool: steady-state steps create no events.
  void ReleaseEvent(EventId event) override;

  // Events created so far (for tests: bounded by the most outstanding at once).
  size_t events_created() const { return events_created_; }

 private:
  std::vector<cudaEvent_t> pool_;
  size_t events_created_ = 0;
};

// The number of CUDA devices; 0 when there is no device or no driver (never crashes).
int CudaDeviceCount();

struct DeviceMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
// cudaMemGetInfo of the current device.
DeviceMemoryInfo QueryDeviceMemory();

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_CUDA_MEMORY_H_
