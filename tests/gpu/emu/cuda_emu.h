// A CPU emulation of the few CUDA device features kernels/cuda/ uses, so the kernels' own source
// can run on a machine without a GPU (tests/gpu/emu/README.md). Force-included (g++ -include)
// into every translation unit of the emulated build, before any CUDA header.
//
// Model: a launch runs its blocks one after another; the blockDim.x threads of a block are
// fibers (cuda_emu_runtime.cc) on the calling thread, each running until it reaches a barrier or
// returns.
// __syncthreads is a barrier over the block's fibers, warp shuffles a barrier over the warp's
// plus a slot per lane. __shared__ becomes `static`, shared by all threads of a block, which is
// correct because blocks never run concurrently. Threads that return early drop out of the
// barriers, as exited threads do on a GPU. Fibers run in increasing thread order in even blocks
// and decreasing order in odd ones, so a read of shared memory that a missing __syncthreads
// leaves unordered sees the wrong value in one of the two. Only 1-D blocks whose size is a
// multiple of 32 are supported.
#ifndef LOOM_TESTS_GPU_EMU_CUDA_EMU_H_
#define LOOM_TESTS_GPU_EMU_CUDA_EMU_H_

#define __global__
#define __device__
#define __host__
#define __shared__ static

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include <array>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace loom::emu {

// The state the threads of one running block share besides __shared__ memory.
struct Block {
  std::vector<std::array<float, 32>> slots;  // per warp, one value per lane (shuffles)
  int or_result = 0;                         // __syncthreads_or
};

extern thread_local Block* current_block;

// Waits until every thread of the block that has not returned has arrived (__syncthreads).
void BlockSync();
// Waits until every thread of the caller's warp that has not returned has arrived.
void WarpSync();

// Runs body once per thread of every block of the grid; see the file comment.
void RunGrid(dim3 grid, dim3 block, const std::function<void()>& body);

// Aborts unless `stream` is the default stream or one created and not yet destroyed.
void CheckStream(cudaStream_t stream, const char* what);

// Aborts unless p points into (or just past the end of) a live cudaMalloc allocation.
void CheckDevicePointer(const void* p, const char* what);

// A kernel may only dereference device memory: every non-null pointer argument must point into
// a live allocation (a host buffer or a freed block passed to a kernel aborts).
template <typename T>
void CheckKernelArg(const T& arg) {
  if constexpr (std::is_pointer_v<T>) {
    if (arg != nullptr) CheckDevicePointer(arg, "kernel pointer argument");
  }
}

// kernel<<<grid, block, smem, stream>>>(args...) is rewritten to
// Launch(&kernel, grid, block, smem, stream)(args...) by rewrite_launches.py.
template <typename F>
auto Launch(F* kernel, dim3 grid, dim3 block, size_t = 0, cudaStream_t stream = nullptr) {
  CheckStream(stream, "kernel launch");
  return [=](auto&&... args) {
    (CheckKernelArg(args), ...);
    RunGrid(grid, block, [&] { kernel(args...); });
  };
}

}  // namespace loom::emu

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

inline void __syncthreads() { loom::emu::BlockSync(); }

inline int __syncthreads_or(int predicate) {
  loom::emu::Block* b = loom::emu::current_block;
  loom::emu::BlockSync();  // every reader of the previous result is done
  if (threadIdx.x == 0) b->or_result = 0;
  loom::emu::BlockSync();
  if (predicate) b->or_result = 1;
  loom::emu::BlockSync();
  return b->or_result;
}

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  std::array<float, 32>& slot = loom::emu::current_block->slots[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  slot[lane] = value;
  loom::emu::WarpSync();
  const float result = slot[lane ^ lane_mask];
  loom::emu::WarpSync();  // nobody overwrites a slot before everyone has read
  return result;
}

template <typename T>
inline T min(T a, T b) {
  return a < b ? a : b;
}

#endif  // LOOM_TESTS_GPU_EMU_CUDA_EMU_H_
