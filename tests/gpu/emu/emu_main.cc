// The CUDA op checks (tests/gpu/op_checks.h) in the CPU emulation: the shapes of
// tests/kernels/cuda_ops_test.cc, and with --odd the odd-shape half of loom-gpu-op-check.
// Prints one line per output and exits non-zero on any failure or on a cuBLAS call the real
// library would reject (tests/gpu/emu/README.md).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cuda/gemm_context.h"
#include "tests/gpu/op_checks.h"

namespace loom::emu {
int ShapeErrors();
}  // namespace loom::emu

namespace {

namespace gc = ::loom::gpu_check;

int failures = 0;

void Print(const std::vector<gc::Result>& results) {
  for (const gc::Result& r : results) {
    std::printf("%-44s %-32s %10.3e  tol %7.1e  %s  %s\n", r.op.c_str(), r.shape.c_str(), r.error,
                r.tolerance, r.Pass() ? "PASS" : "FAIL", r.note.c_str());
    failures += !r.Pass();
  }
  std::fflush(stdout);
}

void SmallShapes() {
  loom::kernels::cuda::GemmContext ctx(1 << 20);
  loom::kernels::cuda::GemmContext tiny(4096);  // forces long bias-gradient chunks
  for (long n : {1L, 7L, 8L, 1005L}) {
    Print(gc::CheckCast(n, 11 + n));
    Print(gc::CheckResidual(n, 12 + n));
    Print(gc::CheckGelu(n, 13 + n));
  }
  Print(gc::CheckEncoder(2, 7, 24, 50, 21));
  Print(gc::CheckEncoder(3, 5, 13, 11, 22));
  Print(gc::CheckEncoder(2, 21, 8, 40, 23));
  Print(gc::CheckEncoder(1, 37, 1100, 5, 24));  // two column blocks
  Print(gc::CheckLayerNorm(13, 72, 31));
  Print(gc::CheckLayerNorm(9, 45, 32));
  Print(gc::CheckLayerNorm(130, 768, 33));
  Print(gc::CheckMatmulForward(ctx, 21, 40, 24, true, false, 21, 41));
  Print(gc::CheckMatmulForward(ctx, 21, 45, 37, false, false, 21, 42));
  Print(gc::CheckMatmulForward(ctx, 21, 45, 37, true, false, 21, 43));
  Print(gc::CheckMatmulForward(ctx, 21, 40, 64, true, true, 21, 44));
  Print(gc::CheckMatmulForward(ctx, 21, 40, 36, true, true, 10, 45));
  Print(gc::CheckMatmulBackward(ctx, 21, 40, 24, true, 46));
  Print(gc::CheckMatmulBackward(ctx, 17, 45, 37, true, 47));
  Print(gc::CheckMatmulBackward(ctx, 130, 16, 8, false, 48));
  Print(gc::CheckMatmulBackward(tiny, 300, 16, 512, true, 49));
  Print(gc::CheckAttention(ctx, 2, 7, 18, 3, 2, 51));
  Print(gc::CheckAttention(ctx, 3, 13, 15, 5, 3, 52));
  Print(gc::CheckAttention(ctx, 2, 33, 64, 2, 1, 53));
  Print(gc::CheckAttention(ctx, 1, 2, 8, 2, 1, 54));
  // Fused attention: head sizes 16, 32, 48 and 64; T below one tile, across tiles and blocks
  // and not a multiple of either.
  Print(gc::CheckFlashAttention(2, 7, 32, 2, 2, 55));
  Print(gc::CheckFlashAttention(3, 70, 64, 2, 3, 56));
  Print(gc::CheckFlashAttention(2, 33, 48, 1, 2, 57));
  Print(gc::CheckFlashAttention(1, 130, 128, 2, 1, 58));
  Print(gc::CheckCrossEntropy(11, 101, 104, 11, 61));
  Print(gc::CheckCrossEntropy(7, 50, 50, 7, 62));
  Print(gc::CheckCrossEntropy(5, 3000, 3008, 3, 63));
  Print(gc::CheckAdamW(1001, 71));
  Print(gc::CheckAdamW(4096, 72));
  Print(gc::CheckGradNorm(100003, 73));
  Print(gc::CheckGradNorm(5, 74));
}

void OddShapes() {
  loom::kernels::cuda::GemmContext ctx(1 << 20);
  struct Model {
    int B, T, C, NH, V, Vp;
  };
  std::uint64_t seed = 1;
  for (const Model& m : {Model{3, 37, 72, 3, 101, 104}, Model{2, 29, 45, 3, 77, 77}}) {
    const int N = m.B * m.T;
    Print(gc::CheckCast(static_cast<long>(N) * m.C + 5, seed++));
    Print(gc::CheckResidual(static_cast<long>(N) * m.C + 3, seed++));
    Print(gc::CheckGelu(static_cast<long>(N) * 4 * m.C + 7, seed++));
    Print(gc::CheckEncoder(m.B, m.T, m.C, m.V, seed++));
    Print(gc::CheckLayerNorm(N, m.C, seed++));
    Print(gc::CheckMatmulForward(ctx, N, m.C, 3 * m.C, true, false, N, seed++));
    Print(gc::CheckMatmulForward(ctx, N, m.C, 4 * m.C, true, true, N, seed++));
    Print(gc::CheckMatmulForward(ctx, N, m.C, m.Vp, false, false, N, seed++));
    Print(gc::CheckMatmulBackward(ctx, N, m.C, 3 * m.C, true, seed++));
    Print(gc::CheckMatmulBackward(ctx, N, 4 * m.C, m.C, true, seed++));
    Print(gc::CheckMatmulBackward(ctx, N, m.C, m.Vp, false, seed++));
    Print(gc::CheckAttention(ctx, m.B, m.T, m.C, m.NH, m.B, seed++));
    Print(gc::CheckCrossEntropy(N, m.V, m.Vp, N, seed++));
    Print(gc::CheckAdamW(static_cast<long>(m.C) * 3 * m.C + 1, seed++));
    Print(gc::CheckGradNorm(static_cast<long>(m.C) * 3 * m.C + 1, seed++));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool odd = argc > 1 && std::strcmp(argv[1], "--odd") == 0;
  if (odd) {
    OddShapes();
  } else {
    SmallShapes();
  }
  const int shape_errors = loom::emu::ShapeErrors();
  std::printf("%s: %d failure(s), %d cuBLAS call(s) the real library would reject\n",
              failures || shape_errors ? "FAIL" : "PASS", failures, shape_errors);
  return failures || shape_errors ? 1 : 0;
}
