#include "worker/train/device/cuda_memory.h"

#include "worker/train/device/cuda_check.h"
#include "worker/train/device/cuda_stream.h"

namespace loom::train {
namespace {

cudaEvent_t ToCudaEvent(EventId id) {
  return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(id));
}
EventId ToEventId(cudaEvent_t event) {
  return static_cast<EventId>(reinterpret_cast<std::uintptr_t>(event));
}

}  // namespace

CudaMemory::~CudaMemory() {
  // No check: the context may already be torn down at process exit.
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

void* CudaMemory::Allocate(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clears the error so later calls do not report it
    return nullptr;
  }
  LOOM_TRAIN_CUDA_CHECK(err);
  return ptr;
}

void CudaMemory::Free(void* ptr) { LOOM_TRAIN_CUDA_CHECK(cudaFree(ptr)); }

EventId CudaMemory::RecordEvent(StreamId stream) {
  cudaEvent_t event;
  if (pool_.empty()) {
    LOOM_TRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    ++events_created_;
  } else {
    event = pool_.back();
    pool_.pop_back();
  }
  LOOM_TRAIN_CUDA_CHECK(cudaEventRecord(event, ToCudaStream(stream)));
  return ToEventId(event);
}

bool CudaMemory::EventDone(EventId event) {
  const cudaError_t err = cudaEventQuery(ToCudaEvent(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LOOM_TRAIN_CUDA_CHECK(err);
  return true;
}

void CudaMemory::ReleaseEvent(EventId event) { pool_.push_back(ToCudaEvent(event)); }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

DeviceMemoryInfo QueryDeviceMemory() {
  DeviceMemoryInfo info;
  LOOM_TRAIN_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

}  // namespace loom::train
