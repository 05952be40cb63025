// NVTX ranges, so Nsight Systems shows the training core's phases (forward, backward, optimizer)
// and each collective on its timeline. NVTX 3 is header-only (from the CUDA toolkit); without a
// profiler attached a push or pop costs a few nanoseconds.
#ifndef LOOM_WORKER_TRAIN_DEVICE_NVTX_RANGE_H_
#define LOOM_WORKER_TRAIN_DEVICE_NVTX_RANGE_H_

#include <cstdint>

namespace loom::train {

// Colours (ARGB) that tell the phases apart on the timeline.
inline constexpr uint32_t kNvtxGrey = 0xFF9E9E9E;
inline constexpr uint32_t kNvtxForward = 0xFF4CAF50;
inline constexpr uint32_t kNvtxBackward = 0xFF2196F3;
inline constexpr uint32_t kNvtxOptimizer = 0xFFFF9800;
inline constexpr uint32_t kNvtxComm = 0xFFE91E63;

// Opens a range named `name` on the calling thread's NVTX stack. Ranges nest; each push needs
// one pop on the same thread.
void NvtxPush(const char* name, uint32_t argb = kNvtxGrey);
void NvtxPop();

// A range for the lifetime of the object, on the constructing thread, e.g.
//   { NvtxRange range("all_reduce bucket 3", kNvtxComm); comm.AllReduce(...); }
class NvtxRange {
 public:
  explicit NvtxRange(const char* name, uint32_t argb = kNvtxGrey) { NvtxPush(name, argb); }
  ~NvtxRange() { NvtxPop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_NVTX_RANGE_H_
