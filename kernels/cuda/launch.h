// Host-side launch arithmetic of the CUDA backend: grid and block sizes, vector widths,
// alignment and scratch sizes. Plain C++ with no CUDA header, so it is unit-tested on machines
// without a GPU (tests/kernels/cuda_ops_test.cc), and the launchers in kernels/cuda/*.cu use
// nothing else to size their grids.
//
// Determinism: every reduction across rows (bias and layernorm weight gradients, the sum of
// squares) is split into chunks whose size depends only on the problem shape and the constants
// here, never on the device (SM count) or on timing, so results are bit-for-bit reproducible
// on any GPU.
#ifndef LOOM_KERNELS_CUDA_LAUNCH_H_
#define LOOM_KERNELS_CUDA_LAUNCH_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace loom::kernels::cuda::launch {

inline constexpr int kWarpSize = 32;
// Threads per block of the elementwise and column kernels.
inline constexpr int kBlock = 256;
// bf16 elements per 16-byte vector load or store.
inline constexpr int kPack = 8;
// Grid-stride kernels launch at most this many blocks and loop over the rest; far above what
// fills an H200 (132 SMs x 8 blocks of 256 threads), far below the grid.x limit (2^31 - 1).
inline constexpr long kMaxGridBlocks = 1L << 16;
// Rows summed by one thread in the first pass of a column reduction (at least; see
// ColumnSumRowsPerChunk).
inline constexpr int kColumnSumRows = 64;
// cuBLASLt workspace: 32 MiB is what NVIDIA recommends for Hopper.
inline constexpr size_t kMatmulWorkspaceBytes = size_t{32} << 20;
// Sum of squares: a fixed grid (device-independent, hence deterministic) of this many blocks
// of kGradNormThreads, each writing one fp32 partial, then one block adding the partials.
inline constexpr int kGradNormBlocks = 1024;
inline constexpr int kGradNormThreads = 512;
// Cross-entropy forward: one block of this many threads per row (V is about 50k).
inline constexpr int kCrossEntropyThreads = 1024;

// ceil(a / b) for a >= 0, b > 0.
constexpr long CeilDiv(long a, long b) { return (a + b - 1) / b; }

// Blocks of `block` threads for a grid-stride loop over `items` work items: enough to cover them,
// capped at kMaxGridBlocks, and at least 1.
constexpr int GridBlocks(long items, int block) {
  return static_cast<int>(std::clamp(CeilDiv(items, block), 1L, kMaxGridBlocks));
}

// Blocks for a kernel that gives each row one warp, `block` threads per block.
constexpr int WarpRowBlocks(long rows, int block) {
  return static_cast<int>(CeilDiv(rows, block / kWarpSize));
}

// True when every pointer is a multiple of 16 bytes (nullptr counts as aligned: it is unused).
inline bool AllAligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Vector width (kPack or 1) for a kernel that walks rows of `row_len` bf16 elements, the rows of
// every buffer starting at base + r * row_len: kPack when each row start is 16-byte aligned
// (every base aligned and row_len a multiple of kPack), else 1 (scalar loads).
inline int RowPackWidth(long row_len, std::initializer_list<const void*> bases) {
  return (row_len % kPack == 0 && AllAligned16(bases)) ? kPack : 1;
}

// Elementwise kernels over n elements: with every pointer aligned, the first VectorPrefix(n)
// elements go in kPack-wide vectors and the rest (fewer than kPack) one at a time.
constexpr long VectorPrefix(long n) { return n / kPack * kPack; }

// The alignment of an address as cuBLASLt's heuristics want it: the largest power of two that
// divides it, capped at 256 (their default assumption). nullptr gives 256.
inline std::uint32_t PointerAlignment(const void* p) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// Rows per chunk for the deterministic two-pass column sum of an (N, cols) matrix whose first
// pass writes ceil(N / rows) * cols fp32 partials into scratch_bytes: at least kColumnSumRows,
// more when the partials would not fit. Depends only on the shape and scratch_bytes (a
// constant), so the summation order is fixed. Returns 0 when even one chunk does not fit.
constexpr long ColumnSumRowsPerChunk(long N, long cols, size_t scratch_bytes) {
  const long max_chunks = static_cast<long>(scratch_bytes / (sizeof(float) * cols));
  if (max_chunks < 1) return 0;
  return std::max<long>(kColumnSumRows, CeilDiv(N, max_chunks));
}

// fp32 scratch floats that layernorm_backward needs: two partial sums (weight and bias
// gradients) per channel and chunk of kColumnSumRows rows.
constexpr long LayerNormBackwardScratchFloats(long N, long C) {
  return 2 * CeilDiv(N, kColumnSumRows) * C;
}

// Attention scratch, per batch element (the launchers loop over b and reuse it): the (NH,T,T)
// fp32 scores or d(att), then, at a 256-byte aligned offset, the (NH,T,T) bf16 d(scores).
constexpr size_t AttentionScoresBytes(long T, long NH) {
  return static_cast<size_t>(NH * T * T) * sizeof(float);
}
constexpr size_t AttentionDscoresOffset(long T, long NH) {
  return static_cast<size_t>(CeilDiv(static_cast<long>(AttentionScoresBytes(T, NH)), 256) * 256);
}
constexpr size_t AttentionScratchBytes(long T, long NH) {
  return AttentionDscoresOffset(T, NH) + static_cast<size_t>(NH * T * T) * 2;
}

// Fused (flash) attention, kernels/cuda/flash_attention.h: tiles of queries and keys held in
// shared memory, scores never stored whole. Four warps per block, each warp owning 16 rows of
// its block's tile (the 16x16x16 bf16 tensor-core shape). The forward and the dQ kernel walk a
// block of kFlashQueryRows queries over tiles of kFlashKeyCols keys; the dK/dV kernel walks a
// block of kFlashQueryRows keys over tiles of kFlashKeyCols queries. Sized so that each kernel's
// static shared memory stays under 48 KiB at the largest head size.
inline constexpr int kFlashThreads = 128;
inline constexpr int kFlashQueryRows = 64;
inline constexpr int kFlashKeyCols = 32;
inline constexpr int kFlashMaxHeadSize = 64;

// True when the fused kernels handle heads of C / NH channels: a multiple of 16 (the tensor-core
// tile) up to kFlashMaxHeadSize. GPT-2's presets have 64.
constexpr bool FlashAttentionSupported(long C, long NH) {
  if (NH <= 0 || C % NH != 0) return false;
  const long HS = C / NH;
  return HS > 0 && HS % 16 == 0 && HS <= kFlashMaxHeadSize;
}

// Backward scratch of the fused path: D = rowsum(dout * out), (B, NH, T) fp32.
constexpr size_t FlashAttentionScratchBytes(long B, long T, long NH) {
  return static_cast<size_t>(CeilDiv(B * NH * T * 4, 256) * 256);
}

// Cross-entropy backward grid: one row per blockIdx.x, columns in chunks of kBlock threads x
// kPack elements along blockIdx.y.
constexpr int CrossEntropyColumnBlocks(long V) {
  return static_cast<int>(CeilDiv(V, static_cast<long>(kBlock) * kPack));
}

}  // namespace loom::kernels::cuda::launch

#endif  // LOOM_KERNELS_CUDA_LAUNCH_H_
