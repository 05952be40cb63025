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
  std::vector<std::array<float, 768>> tiles;  // per warp, the a, b and c tiles of an MMA
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

inline void __syncwarp(unsigned = 0xffffffffu) { loom::emu::WarpSync(); }

// Warp matrix multiply-accumulate (<mma.h>, empty without nvcc), the 16x16x16 shapes with bf16
// operands and fp32 accumulators only. A fragment's elements are spread over the warp's lanes
// as on a GPU, where the mapping is unspecified: here element e of lane l is entry
// (e * 32 + l) * 109 mod 256 of the row-major 16x16 tile, a scrambled order that matches no
// natural loop over the tile, so code that assumes a mapping, or reads a tile other lanes stored
// without a __syncwarp, shows wrong results. The loads and stores check the
// alignment a GPU requires (32-byte pointers, ldm a multiple of 16 bytes); mma_sync gathers the
// three tiles through the warp's barrier and computes in fp32.
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

namespace internal {
void CheckTile(const void* p, unsigned ldm, size_t element_bytes, const char* what);
inline int Lane() { return static_cast<int>(threadIdx.x % 32); }
// The row-major tile entry of a fragment's element e on this lane, its row and its column.
inline int Index(int e) { return (e * 32 + Lane()) * 109 % 256; }
inline int Row(int e) { return Index(e) / 16; }
inline int Col(int e) { return Index(e) % 16; }
}  // namespace internal

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  internal::CheckTile(p, ldm, sizeof(T), "load_matrix_sync");
  constexpr bool row = std::is_same_v<Layout, row_major>;
  for (int e = 0; e < 8; ++e) {
    const int r = internal::Row(e), c = internal::Col(e);
    f.x[e] = row ? p[r * ldm + c] : p[c * ldm + r];
  }
  loom::emu::WarpSync();
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  internal::CheckTile(p, ldm, sizeof(float), "load_matrix_sync");
  for (int e = 0; e < 8; ++e) {
    const int r = internal::Row(e), c = internal::Col(e);
    f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
  loom::emu::WarpSync();
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  internal::CheckTile(p, ldm, sizeof(float), "store_matrix_sync");
  loom::emu::WarpSync();
  for (int e = 0; e < 8; ++e) {
    const int r = internal::Row(e), c = internal::Col(e);
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}

template <typename F>
inline void fill_fragment(F& f, float value) {
  for (auto& x : f.x) x = value;
}

template <typename LayoutA, typename LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  std::array<float, 768>& t = loom::emu::current_block->tiles[threadIdx.x / 32];
  loom::emu::WarpSync();  // every lane is done with the previous MMA's tiles
  for (int e = 0; e < 8; ++e) {
    const int i = internal::Index(e);
    t[i] = __bfloat162float(a.x[e]);
    t[256 + i] = __bfloat162float(b.x[e]);
    t[512 + i] = c.x[e];
  }
  loom::emu::WarpSync();
  for (int e = 0; e < 8; ++e) {
    const int r = internal::Row(e), n = internal::Col(e);
    float sum = t[512 + r * 16 + n];
    for (int k = 0; k < 16; ++k) sum += t[r * 16 + k] * t[256 + k * 16 + n];
    d.x[e] = sum;
  }
}
}  // namespace nvcuda::wmma

template <typename T>
inline T min(T a, T b) {
  return a < b ? a : b;
}

#endif  // LOOM_TESTS_GPU_EMU_CUDA_EMU_H_
