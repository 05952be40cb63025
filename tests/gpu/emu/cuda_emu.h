// A CPU emulation of the few CUDA device features kernels/cuda/ uses, so the kernels' own source
// can run on a machine without a GPU (tests/gpu/emu/README.md). Force-included (g++ -include)
// into every translation unit of the emulated build, before any CUDA header.
//
// Model: a launch runs its blocks one after another; each block runs blockDim.x std::threads.
// __syncthreads is a std::barrier over the block, warp shuffles a barrier over the warp plus a
// slot per lane. __shared__ becomes `static`, shared by all threads of a block, which is correct
// because blocks never run concurrently. Threads that return early drop out of the barriers, as
// exited threads do on a GPU. Only 1-D blocks whose size is a multiple of 32 are supported.
#ifndef LOOM_TESTS_GPU_EMU_CUDA_EMU_H_
#define LOOM_TESTS_GPU_EMU_CUDA_EMU_H_

#define __global__
#define __device__
#define __host__
#define __shared__ static

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <vector>

namespace loom::emu {

struct Warp {
  std::unique_ptr<std::barrier<>> barrier;
  float slot[32];
};

// The state the threads of one running block share.
struct Block {
  std::unique_ptr<std::barrier<>> barrier;
  std::vector<Warp> warps;
  std::atomic<int> or_result{0};
};

extern thread_local Block* current_block;

// Runs body once per thread of every block of the grid; see the file comment.
void RunGrid(dim3 grid, dim3 block, const std::function<void()>& body);

// kernel<<<grid, block, smem, stream>>>(args...) is rewritten to
// Launch(&kernel, grid, block, smem, stream)(args...) by rewrite_launches.py.
template <typename F>
auto Launch(F* kernel, dim3 grid, dim3 block, size_t = 0, cudaStream_t = nullptr) {
  return [=](auto&&... args) { RunGrid(grid, block, [&] { kernel(args...); }); };
}

}  // namespace loom::emu

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

inline void __syncthreads() { loom::emu::current_block->barrier->arrive_and_wait(); }

inline int __syncthreads_or(int predicate) {
  loom::emu::Block* b = loom::emu::current_block;
  b->barrier->arrive_and_wait();  // every reader of the previous result is done
  if (threadIdx.x == 0) b->or_result = 0;
  b->barrier->arrive_and_wait();
  if (predicate) b->or_result.fetch_or(1);
  b->barrier->arrive_and_wait();
  return b->or_result.load();
}

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  loom::emu::Warp& w = loom::emu::current_block->warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  w.slot[lane] = value;
  w.barrier->arrive_and_wait();
  const float result = w.slot[lane ^ lane_mask];
  w.barrier->arrive_and_wait();  // nobody overwrites a slot before everyone has read
  return result;
}

template <typename T>
inline T min(T a, T b) {
  return a < b ? a : b;
}

#endif  // LOOM_TESTS_GPU_EMU_CUDA_EMU_H_
