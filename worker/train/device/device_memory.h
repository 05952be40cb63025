// The raw device-memory interface under the caching allocator: allocate and free ranges of
// device memory, and record and query events on streams. CudaMemory (cuda_memory.h) implements
// it with cudaMalloc/cudaFree and CUDA events; tests implement it with a fake on the CPU, so all
// of the allocator's logic is tested without a GPU.
#ifndef LOOM_WORKER_TRAIN_DEVICE_DEVICE_MEMORY_H_
#define LOOM_WORKER_TRAIN_DEVICE_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>

namespace loom::train {

// A stream, as an opaque value: a cudaStream_t converted to an integer on CUDA (0 is the legacy
// default stream), any distinct values in a fake. Distinct enum classes keep streams and events
// from being mixed up.
enum class StreamId : std::uintptr_t { kDefault = 0 };

// An event handed out by DeviceMemory::RecordEvent; valid until ReleaseEvent.
enum class EventId : std::uintptr_t {};

// Threading: the allocator calls these methods with its own mutex held, from any thread, one
// call at a time; implementations need no locking of their own for the allocator's sake.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // Allocates `bytes` (> 0) of device memory. Returns nullptr when the device is out of memory;
  // any other failure crashes (a broken device is not recoverable here).
  virtual void* Allocate(size_t bytes) = 0;

  // Frees a range returned by Allocate. The range may still be in use by work queued on any
  // stream; the implementation waits for it (cudaFree synchronizes the device).
  virtual void Free(void* ptr) = 0;

  // Records an event on `stream` that completes once all work queued on it so far has.
  virtual EventId RecordEvent(StreamId stream) = 0;

  // True once the event has completed. Never blocks.
  virtual bool EventDone(EventId event) = 0;

  // Gives the event back; it is not used again by the caller. Implementations may pool events.
  virtual void ReleaseEvent(EventId event) = 0;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_DEVICE_MEMORY_H_
