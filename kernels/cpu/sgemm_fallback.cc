// Portable fp32 GEMM: the layout of Goto's algorithm (as in BLIS) in plain C++.
//
// The output is cut into fixed kMc x kNc tiles; each tile belongs to one OpenMP thread, which
// walks K in kKc blocks: it packs the tile's A block (kMc x kKc, in kMr-row slivers) and B block
// (kKc x kNc, in kNr-column slivers) into contiguous buffers, then runs a kMr x kNr register
// micro-kernel over every sliver pair. Packing makes the inner loop read both operands with unit
// stride whatever the transposes, and zero-pads the edges so the micro-kernel has no edge cases.
// The micro-kernel uses GCC/Clang vector extensions on four-float vectors, which every 64-bit
// target has (SSE2, NEON); no intrinsics, so it builds on any architecture. On x86-64 CPUs with
// AVX2 (detected at run time) the same code runs on eight-float vectors, twice as fast. Sizes: one
// B sliver (kKc x kNr, 8 KiB) stays in L1, the A block (kMc x kKc, 96 KiB) in L2.
//
// Determinism: tiles are fixed by the shape alone and every element's sum over K runs in order on
// the one thread that owns its tile, so the bits do not depend on the thread count.
#include "kernels/cpu/sgemm_fallback.h"

#include <algorithm>
#include <vector>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

// 6 x 8 accumulators are 12 four-float registers, plus 2 for the B row and 1 for the broadcast A
// element: the 16 vector registers of baseline x86-64 (SSE2) and half of aarch64's NEON file.
constexpr int kMr = 6;
constexpr int kNr = 8;
constexpr int kKc = 256;
// Tiles are small enough that a GEMM with a narrow output (a C x C weight gradient) still has
// a tile per thread, large enough that re-packing B once per row of tiles costs ~1/kMc of the work.
constexpr int kMc = 16 * kMr;  // 96
constexpr int kNc = 32 * kNr;  // 256

// Below this many multiply-adds a GEMM runs on the calling thread: starting a parallel region
// costs more than it saves (attention's per-head GEMMs at small T, for instance).
constexpr long kParallelMinWork = 1L << 18;

// Element (i, p) of op(A) and (p, j) of op(B).
inline float OpA(const float* A, long lda, bool trans, long i, long p) {
  return trans ? A[p * lda + i] : A[i * lda + p];
}
inline float OpB(const float* B, long ldb, bool trans, long p, long j) {
  return trans ? B[j * ldb + p] : B[p * ldb + j];
}

// op(A)[i0:i0+mc, p0:p0+kc] into slivers of kMr rows, each stored p-major (kc x kMr); rows past mc
// are zero.
void PackA(const float* A, long lda, bool trans, long i0, int mc, long p0, int kc, float* out) {
  for (int s = 0; s < mc; s += kMr) {
    const int rows = std::min(kMr, mc - s);
    for (int p = 0; p < kc; ++p) {
      for (int i = 0; i < rows; ++i) out[i] = OpA(A, lda, trans, i0 + s + i, p0 + p);
      for (int i = rows; i < kMr; ++i) out[i] = 0.0f;
      out += kMr;
    }
  }
}

// op(B)[p0:p0+kc, j0:j0+nc] into slivers of kNr columns, each stored p-major (kc x kNr); columns
// past nc are zero.
void PackB(const float* B, long ldb, bool trans, long p0, int kc, long j0, int nc, float* out) {
  for (int s = 0; s < nc; s += kNr) {
    const int cols = std::min(kNr, nc - s);
    for (int p = 0; p < kc; ++p) {
      for (int j = 0; j < cols; ++j) out[j] = OpB(B, ldb, trans, p0 + p, j0 + s + j);
      for (int j = cols; j < kNr; ++j) out[j] = 0.0f;
      out += kNr;
    }
  }
}

struct Args {
  bool trans_a, trans_b;
  int M, N, K;
  float alpha;
  const float* A;
  long lda;
  const float* B;
  long ldb;
  float beta;
  float* C;
  long ldc;
};

#if defined(__GNUC__)
// acc (S*kMr x kNr) = S consecutive A slivers (each kc x kMr) ^T @ a B sliver (kc x kNr), each
// element summed over p in order with a separate multiply and add (no -ffp-contract), so the bits
// are the same for every S and vector width. GCC/Clang vector extensions keep the accumulators
// in registers on any target; auto-vectorised plain loops left them in memory, ~10x slower.
template <int S, int VecBytes>
[[gnu::always_inline]] inline void MicroKernel(int kc, const float* __restrict a,
                                               const float* __restrict b, float* __restrict acc) {
  typedef float Vec __attribute__((vector_size(VecBytes)));
  constexpr int kLanes = VecBytes / 4;
  constexpr int kVecs = kNr / kLanes;
  Vec c[S * kMr][kVecs] = {};
  for (int p = 0; p < kc; ++p) {
    Vec bv[kVecs];
    for (int v = 0; v < kVecs; ++v) __builtin_memcpy(&bv[v], b + p * kNr + v * kLanes, VecBytes);
    for (int s = 0; s < S; ++s) {
      const float* ap = a + static_cast<long>(s) * kMr * kc + p * kMr;
      for (int i = 0; i < kMr; ++i) {
        const float ai = ap[i];
        for (int v = 0; v < kVecs; ++v) c[s * kMr + i][v] += ai * bv[v];
      }
    }
  }
  for (int i = 0; i < S * kMr; ++i)
    for (int v = 0; v < kVecs; ++v)
      __builtin_memcpy(acc + i * kNr + v * kLanes, &c[i][v], VecBytes);
}
#else
template <int S, int VecBytes>
inline void MicroKernel(int kc, const float* a, const float* b, float* acc) {
  float c[S * kMr][kNr] = {};
  for (int p = 0; p < kc; ++p) {
    for (int s = 0; s < S; ++s) {
      const float* ap = a + static_cast<long>(s) * kMr * kc + p * kMr;
      for (int i = 0; i < kMr; ++i)
        for (int j = 0; j < kNr; ++j) c[s * kMr + i][j] += ap[i] * b[p * kNr + j];
    }
  }
  for (int i = 0; i < S * kMr; ++i)
    for (int j = 0; j < kNr; ++j) acc[i * kNr + j] = c[i][j];
}
#endif

// C[i0:i0+mc, j0:j0+nc] over all of K, with the caller's packing buffers; S A slivers per
// micro-kernel call where that many remain (the last odd sliver alone).
template <int S, int VecBytes>
[[gnu::always_inline]] inline void TileT(const Args& g, long i0, int mc, long j0, int nc,
                                         float* a_pack, float* b_pack) {
  alignas(64) float acc[S * kMr * kNr];
  for (int p0 = 0; p0 < g.K; p0 += kKc) {
    const int kc = std::min(kKc, g.K - p0);
    const bool first = p0 == 0;
    PackB(g.B, g.ldb, g.trans_b, p0, kc, j0, nc, b_pack);
    PackA(g.A, g.lda, g.trans_a, i0, mc, p0, kc, a_pack);
    for (int jr = 0; jr < nc; jr += kNr) {
      const int cols = std::min(kNr, nc - jr);
      for (int ir = 0; ir < mc;) {
        const float* a = a_pack + static_cast<long>(ir) * kc;
        const float* b = b_pack + static_cast<long>(jr) * kc;
        int span = kMr;
        if (S > 1 && mc - ir > (S - 1) * kMr) {
          MicroKernel<S, VecBytes>(kc, a, b, acc);
          span = S * kMr;
        } else {
          MicroKernel<1, VecBytes>(kc, a, b, acc);
        }
        const int rows = std::min(span, mc - ir);
        for (int i = 0; i < rows; ++i) {
          float* c = g.C + (i0 + ir + i) * g.ldc + j0 + jr;
          const float* r = acc + i * kNr;
          if (!first) {
            for (int j = 0; j < cols; ++j) c[j] += g.alpha * r[j];
          } else if (g.beta == 0.0f) {
            // BLAS semantics: with beta = 0, C is not read.
            for (int j = 0; j < cols; ++j) c[j] = g.alpha * r[j];
          } else {
            for (int j = 0; j < cols; ++j) c[j] = g.beta * c[j] + g.alpha * r[j];
          }
        }
        ir += span;
      }
    }
  }
}

// The portable tile: four-float vectors, one 6 x 8 block at a time (12 accumulator registers).
void Tile(const Args& g, long i0, int mc, long j0, int nc, float* a_pack, float* b_pack) {
  TileT<1, 16>(g, i0, mc, j0, nc, a_pack, b_pack);
}

#if defined(__GNUC__) && defined(__x86_64__)
#define LOOM_SGEMM_AVX2 1
// On x86-64 CPUs with AVX2 (chosen at run time, so the build stays portable): eight-float
// vectors, two A slivers per call, a 12 x 8 block in 12 of the 16 ymm registers. Twice the
// portable tile's speed, the same bits.
__attribute__((target("avx2"))) void TileAvx2(const Args& g, long i0, int mc, long j0, int nc,
                                              float* a_pack, float* b_pack) {
  TileT<2, 32>(g, i0, mc, j0, nc, a_pack, b_pack);
}
#endif

// Per-thread packing buffers, kept between calls: the many small GEMMs of attention would
// otherwise allocate (and, above malloc's mmap threshold, fault in) fresh pages every call.
struct PackBuffers {
  std::vector<float> a, b;
};
thread_local PackBuffers t_pack;

}  // namespace

void sgemm_fallback(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  LOOM_KERNEL_CHECK(M >= 0 && N >= 0 && K >= 0, "M, N and K must not be negative");
  if (M == 0 || N == 0) return;
  LOOM_KERNEL_CHECK(C != nullptr && ldc >= N, "bad C");
  if (K == 0 || alpha == 0.0f) {
    for (long i = 0; i < M; ++i) {
      float* c = C + i * ldc;
      for (int j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    }
    return;
  }
  LOOM_KERNEL_CHECK(A != nullptr && lda >= (trans_a ? M : K), "bad A");
  LOOM_KERNEL_CHECK(B != nullptr && ldb >= (trans_b ? K : N), "bad B");
  const Args g{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
#ifdef LOOM_SGEMM_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  const int mt = (M + kMc - 1) / kMc;
  const int nt = (N + kNc - 1) / kNc;
  const int tiles = mt * nt;
  [[maybe_unused]] const long work = static_cast<long>(M) * N * K;  // read only by OpenMP
  // Buffers sized for this shape, not the largest tile, so small GEMMs touch little memory.
  const long kc_max = std::min(K, kKc);
  const long a_size = (std::min(M, kMc) + kMr - 1) / kMr * kMr * kc_max;
  const long b_size = (std::min(N, kNc) + kNr - 1) / kNr * kNr * kc_max;
#pragma omp parallel if (work >= kParallelMinWork && tiles > 1)
  {
    PackBuffers& buf = t_pack;
    if (static_cast<long>(buf.a.size()) < a_size) buf.a.resize(a_size);
    if (static_cast<long>(buf.b.size()) < b_size) buf.b.resize(b_size);
#pragma omp for schedule(static)
    for (int t = 0; t < tiles; ++t) {
      const long i0 = static_cast<long>(t / nt) * kMc;
      const long j0 = static_cast<long>(t % nt) * kNc;
      const int mc = static_cast<int>(std::min<long>(kMc, M - i0));
      const int nc = static_cast<int>(std::min<long>(kNc, N - j0));
#ifdef LOOM_SGEMM_AVX2
      if (avx2) {
        TileAvx2(g, i0, mc, j0, nc, buf.a.data(), buf.b.data());
        continue;
      }
#endif
      Tile(g, i0, mc, j0, nc, buf.a.data(), buf.b.data());
    }
  }
}

}  // namespace loom::kernels::cpu
