// loom-gpu-op-check: every CUDA op, forward and backward, against the double-precision reference
// at GPT-2 124M shapes (B=4 T=1024 C=768 NH=12 V=50257, padded to Vp=50304) and at odd shapes
// (B=3 T=37 C=72 NH=3 V=101, and C=45 for scalar paths), one line per compared output:
//   op  shape  relative error  tolerance  PASS|FAIL  [note]
// Exit status: 0 when everything passes, 1 on any FAIL, 0 with a "no CUDA device" line where
// there is no device (the program is built everywhere nvcc exists).
//
// Where the double reference would take minutes at the full shape, the op still runs at the full
// shape but the reference covers a slice (the first rows, or the first batch element), or the
// op runs at a reduced N (the weight-gradient GEMMs); the note column says which.
//
// --bench: times every op at the 124M shapes (CUDA events, median of 20 runs after 3 warm-ups)
// and prints TFLOP/s for the GEMM-based ops and GB/s (bytes each op must move at least) for the
// memory-bound ones.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/crossentropy.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/gemm_context.h"
#include "kernels/cuda/grad_norm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/residual.h"
#include "tests/gpu/op_checks.h"

namespace {

namespace cu = ::loom::kernels::cuda;
namespace gc = ::loom::gpu_check;

struct Model {
  int B, T, C, NH, V, Vp;
};
constexpr Model kGpt2Small{4, 1024, 768, 12, 50257, 50304};
constexpr Model kOdd{3, 37, 72, 3, 101, 104};

int PrintResults(const std::vector<gc::Result>& results) {
  int failures = 0;
  for (const gc::Result& r : results) {
    std::printf("%-44s %-34s %10.3e  tol %7.1e  %s%s%s\n", r.op.c_str(), r.shape.c_str(), r.error,
                r.tolerance, r.Pass() ? "PASS" : "FAIL", r.note.empty() ? "" : "  ",
                r.note.c_str());
    failures += !r.Pass();
  }
  std::fflush(stdout);
  return failures;
}

int RunChecks() {
  const auto start = std::chrono::steady_clock::now();
  cu::GemmContext ctx;
  int failures = 0;
  std::uint64_t seed = 1;
  // Odd shapes first: fast, and they exercise the scalar and fallback paths.
  for (const Model& m : {kOdd, Model{2, 29, 45, 3, 77, 77}}) {
    const int N = m.B * m.T;
    failures += PrintResults(gc::CheckCast(static_cast<long>(N) * m.C + 5, seed++));
    failures += PrintResults(gc::CheckResidual(static_cast<long>(N) * m.C + 3, seed++));
    failures += PrintResults(gc::CheckGelu(static_cast<long>(N) * 4 * m.C + 7, seed++));
    failures += PrintResults(gc::CheckEncoder(m.B, m.T, m.C, m.V, seed++));
    failures += PrintResults(gc::CheckLayerNorm(N, m.C, seed++));
    failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, 3 * m.C, true, false, N, seed++));
    failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, 4 * m.C, true, true, N, seed++));
    failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, m.Vp, false, false, N, seed++));
    failures += PrintResults(gc::CheckMatmulBackward(ctx, N, m.C, 3 * m.C, true, seed++));
    failures += PrintResults(gc::CheckMatmulBackward(ctx, N, 4 * m.C, m.C, true, seed++));
    failures += PrintResults(gc::CheckMatmulBackward(ctx, N, m.C, m.Vp, false, seed++));
    failures += PrintResults(gc::CheckAttention(ctx, m.B, m.T, m.C, m.NH, m.B, seed++));
    // Heads of 24 and 15 channels: the fused kernels' shapes instead (heads of 16 and 32).
    failures += PrintResults(gc::CheckFlashAttention(m.B, m.T, 16 * m.NH, m.NH, m.B, seed++));
    failures += PrintResults(gc::CheckFlashAttention(m.B, m.T, 32 * m.NH, m.NH, m.B, seed++));
    failures += PrintResults(gc::CheckCrossEntropy(N, m.V, m.Vp, N, seed++));
    failures += PrintResults(gc::CheckAdamW(static_cast<long>(m.C) * 3 * m.C + 1, seed++));
    failures += PrintResults(gc::CheckGradNorm(static_cast<long>(m.C) * 3 * m.C + 1, seed++));
  }
  // GPT-2 124M.
  const Model& m = kGpt2Small;
  const int N = m.B * m.T;
  failures += PrintResults(gc::CheckCast(static_cast<long>(N) * m.C, seed++));
  failures += PrintResults(gc::CheckResidual(static_cast<long>(N) * m.C, seed++));
  failures += PrintResults(gc::CheckGelu(static_cast<long>(N) * 4 * m.C, seed++));
  failures += PrintResults(gc::CheckEncoder(m.B, m.T, m.C, m.V, seed++));
  failures += PrintResults(gc::CheckLayerNorm(N, m.C, seed++));
  // Forward GEMMs at full N; the reference covers the first rows.
  failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, 3 * m.C, true, false, 64, seed++));
  failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, m.C, true, false, 64, seed++));
  failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, 4 * m.C, true, true, 64, seed++));
  failures += PrintResults(gc::CheckMatmulForward(ctx, N, 4 * m.C, m.C, true, false, 64, seed++));
  failures += PrintResults(gc::CheckMatmulForward(ctx, N, m.C, m.Vp, false, false, 16, seed++));
  // Backward GEMMs sum over N: a reduced N keeps the double reference to about a second.
  std::printf("# matmul_backward: reference at reduced N (full C and OC)\n");
  failures += PrintResults(gc::CheckMatmulBackward(ctx, 256, m.C, 3 * m.C, true, seed++));
  failures += PrintResults(gc::CheckMatmulBackward(ctx, 256, 4 * m.C, m.C, true, seed++));
  failures += PrintResults(gc::CheckMatmulBackward(ctx, 16, m.C, m.Vp, false, seed++));
  failures += PrintResults(gc::CheckAttention(ctx, m.B, m.T, m.C, m.NH, 1, seed++));
  failures += PrintResults(gc::CheckFlashAttention(m.B, m.T, m.C, m.NH, 1, seed++));
  failures += PrintResults(gc::CheckCrossEntropy(N, m.V, m.Vp, 64, seed++));
  failures += PrintResults(gc::CheckAdamW(static_cast<long>(m.V) * m.C, seed++));
  failures += PrintResults(gc::CheckGradNorm(124L * 1000 * 1000, seed++));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %d failure(s) in %.1f s\n", failures ? "FAIL" : "PASS", failures, seconds);
  return failures ? 1 : 0;
}

// ---- --bench ----

// A device buffer of random-ish bf16 (or zero) contents for timing.
template <typename T>
struct Buf {
  T* p = nullptr;
  explicit Buf(long n) {
    LOOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), static_cast<size_t>(n) * sizeof(T)));
    LOOM_CUDA_CHECK(cudaMemset(p, 0, static_cast<size_t>(n) * sizeof(T)));
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Fills a bf16 buffer with small values (uniform-ish in [-0.5, 0.5)).
void FillBf16(cu::bf16* p, long n, unsigned seed) {
  std::vector<std::uint16_t> host(n);
  std::uint32_t s = seed * 2654435761u + 1;
  for (auto& h : host) {
    s = s * 1664525u + 1013904223u;
    h = gc::FloatToBf16Bits(static_cast<float>(s >> 8) * 0x1.0p-24f - 0.5f);
  }
  LOOM_CUDA_CHECK(cudaMemcpy(p, host.data(), n * 2, cudaMemcpyHostToDevice));
}

// Median milliseconds of fn over 20 timed runs after 3 warm-ups.
double MedianMs(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  LOOM_CUDA_CHECK(cudaEventCreate(&start));
  LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms(20);
  for (float& t : ms) {
    LOOM_CUDA_CHECK(cudaEventRecord(start, nullptr));
    fn();
    LOOM_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  LOOM_CUDA_CHECK(cudaEventDestroy(start));
  LOOM_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[9] + ms[10]);
}

void ReportFlops(const char* op, const std::string& shape, double flops, double ms) {
  std::printf("%-36s %-30s %9.3f ms  %8.1f TFLOP/s\n", op, shape.c_str(), ms,
              flops / (ms * 1e-3) / 1e12);
}

void ReportBytes(const char* op, const std::string& shape, double bytes, double ms) {
  std::printf("%-36s %-30s %9.3f ms  %8.1f GB/s\n", op, shape.c_str(), ms,
              bytes / (ms * 1e-3) / 1e9);
}

int RunBench() {
  const Model& m = kGpt2Small;
  const int B = m.B, T = m.T, C = m.C, NH = m.NH, V = m.V, Vp = m.Vp;
  const long N = static_cast<long>(B) * T;
  const long NC = N * C;
  cu::GemmContext ctx;
  std::printf("# bench at GPT-2 124M shapes: B=%d T=%d C=%d NH=%d V=%d Vp=%d; median of 20\n", B, T,
              C, NH, V, Vp);
  // Buffers, sized for the largest use of each.
  Buf<cu::bf16> x(N * 4 * C), y(N * 4 * C), z(N * 4 * C), dx(N * 4 * C), dy(N * 4 * C);
  Buf<cu::bf16> w(static_cast<long>(Vp) * C), dw(static_cast<long>(Vp) * C), bias(4 * C),
      dbias(4 * C);
  Buf<cu::bf16> wpe(static_cast<long>(T) * C), qkv(N * 3 * C), dqkv(N * 3 * C),
      att(static_cast<long>(B) * NH * T * T);
  Buf<cu::bf16> logits(N * Vp), dlogits(N * Vp);
  Buf<float> mean(N), rstd(N), losses(N), lse(N), dlosses(N);
  Buf<float> ln_scratch(cu::launch::LayerNormBackwardScratchFloats(N, C));
  Buf<char> att_scratch(static_cast<long>(cu::launch::AttentionScratchBytes(T, NH)));
  Buf<int> tokens(N), targets(N);
  FillBf16(x.p, N * 4 * C, 1);
  FillBf16(y.p, N * 4 * C, 2);
  FillBf16(dy.p, N * 4 * C, 3);
  FillBf16(w.p, static_cast<long>(Vp) * C, 4);
  FillBf16(bias.p, 4 * C, 5);
  FillBf16(wpe.p, static_cast<long>(T) * C, 6);
  FillBf16(qkv.p, N * 3 * C, 7);
  FillBf16(logits.p, N * Vp, 8);
  {
    std::vector<int> host(N);
    for (long i = 0; i < N; ++i) host[i] = static_cast<int>((i * 7919) % V);
    LOOM_CUDA_CHECK(cudaMemcpy(tokens.p, host.data(), N * 4, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(targets.p, host.data(), N * 4, cudaMemcpyHostToDevice));
    std::vector<float> dl(N, 1.0f / N);
    LOOM_CUDA_CHECK(cudaMemcpy(dlosses.p, dl.data(), N * 4, cudaMemcpyHostToDevice));
  }
  char shape[128];
  // Encoder (wte rows as x's first V*C... use w as wte).
  std::snprintf(shape, sizeof shape, "B=%d T=%d C=%d", B, T, C);
  ReportBytes("encoder_forward", shape, 3.0 * NC * 2,
              MedianMs([&] { cu::encoder_forward(x.p, tokens.p, w.p, wpe.p, B, T, C, nullptr); }));
  ReportBytes("encoder_backward", shape, 4.0 * NC * 2, MedianMs([&] {
                cu::encoder_backward(dw.p, dx.p, dy.p, tokens.p, B, T, C, nullptr);
              }));
  std::snprintf(shape, sizeof shape, "N=%ld C=%d", N, C);
  ReportBytes("layernorm_forward", shape, 2.0 * NC * 2, MedianMs([&] {
                cu::layernorm_forward(y.p, mean.p, rstd.p, x.p, w.p, bias.p, N, C, nullptr);
              }));
  ReportBytes("residual_layernorm_forward", shape, 4.0 * NC * 2, MedianMs([&] {
                cu::residual_layernorm_forward(z.p, y.p, mean.p, rstd.p, x.p, dy.p, w.p, bias.p, N,
                                               C, nullptr);
              }));
  ReportBytes("layernorm_backward", shape, 5.0 * NC * 2, MedianMs([&] {
                cu::layernorm_backward(dx.p, dw.p, dbias.p, ln_scratch.p, dy.p, x.p, w.p, mean.p,
                                       rstd.p, N, C, nullptr);
              }));
  struct Gemm {
    const char* name;
    int C, OC;
    bool bias, gelu;
  };
  for (const Gemm& g :
       {Gemm{"matmul qkv", C, 3 * C, true, false}, Gemm{"matmul attproj", C, C, true, false},
        Gemm{"matmul fc+gelu", C, 4 * C, true, true}, Gemm{"matmul fcproj", 4 * C, C, true, false},
        Gemm{"matmul lm_head", C, Vp, false, false}}) {
    std::snprintf(shape, sizeof shape, "N=%ld C=%d OC=%d", N, g.C, g.OC);
    cu::bf16* out = g.OC == Vp ? logits.p : y.p;
    const double flops = 2.0 * N * g.C * g.OC;
    std::string fwd = std::string(g.name) + " fwd";
    ReportFlops(fwd.c_str(), shape, flops, MedianMs([&] {
                  if (g.gelu) {
                    cu::matmul_gelu_forward(ctx, out, z.p, x.p, w.p, bias.p, N, g.C, g.OC, nullptr);
                  } else {
                    cu::matmul_forward(ctx, out, x.p, w.p, g.bias ? bias.p : nullptr, N, g.C, g.OC,
                                       nullptr);
                  }
                }));
    std::string bwd = std::string(g.name) + " bwd";
    const cu::bf16* dout = g.OC == Vp ? dlogits.p : dy.p;
    ReportFlops(bwd.c_str(), shape, 2.0 * flops, MedianMs([&] {
                  cu::matmul_backward(ctx, dx.p, dw.p, g.bias ? dbias.p : nullptr, dout, x.p, w.p,
                                      N, g.C, g.OC, nullptr);
                }));
  }
  std::snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d", B, T, C, NH);
  const double att_flops = 4.0 * B * NH * static_cast<double>(T) * T * (C / NH);
  const double unfused_fwd = MedianMs(
      [&] { cu::attention_forward(ctx, y.p, att.p, att_scratch.p, qkv.p, B, T, C, NH, nullptr); });
  const double unfused_bwd = MedianMs([&] {
    cu::attention_backward(ctx, dqkv.p, att_scratch.p, dy.p, qkv.p, att.p, B, T, C, NH, nullptr);
  });
  ReportFlops("attention_forward", shape, att_flops, unfused_fwd);
  ReportFlops("attention_backward", shape, 2.0 * att_flops, unfused_bwd);
  // The fused kernels at the same shapes, and which path is faster: GptCuda runs the fused one
  // wherever the head size allows (launch::FlashAttentionSupported). The FLOP count is the
  // unfused path's full T x T products; the fused kernels compute only the causal half's tiles,
  // so their TFLOP/s figure is up to twice the work done. Compare the milliseconds.
  {
    Buf<float> att_lse(static_cast<long>(B) * NH * T);
    Buf<char> flash_scratch(static_cast<long>(cu::launch::FlashAttentionScratchBytes(B, T, NH)));
    const double fused_fwd =
        MedianMs([&] { cu::flash_attention_forward(y.p, att_lse.p, qkv.p, B, T, C, NH, nullptr); });
    const double fused_bwd = MedianMs([&] {
      cu::flash_attention_backward(dqkv.p, flash_scratch.p, dy.p, y.p, qkv.p, att_lse.p, B, T, C,
                                   NH, nullptr);
    });
    ReportFlops("flash_attention_forward", shape, att_flops, fused_fwd);
    ReportFlops("flash_attention_backward", shape, 2.0 * att_flops, fused_bwd);
    std::printf("attention fused/unfused (forward + backward): %.3f ms / %.3f ms = %.2f; the %s\n",
                fused_fwd + fused_bwd, unfused_fwd + unfused_bwd,
                (fused_fwd + fused_bwd) / (unfused_fwd + unfused_bwd),
                fused_fwd + fused_bwd <= unfused_fwd + unfused_bwd
                    ? "fused path, GptCuda's default, is faster"
                    : "UNFUSED path is faster: jobs can set train.attention: unfused; the default "
                      "should change");
  }
  std::snprintf(shape, sizeof shape, "n=%ld", N * 4 * C);
  ReportBytes("gelu_forward", shape, 2.0 * N * 4 * C * 2,
              MedianMs([&] { cu::gelu_forward(y.p, x.p, N * 4 * C, nullptr); }));
  ReportBytes("gelu_backward", shape, 4.0 * N * 4 * C * 2,
              MedianMs([&] { cu::gelu_backward(dx.p, x.p, dy.p, N * 4 * C, nullptr); }));
  std::snprintf(shape, sizeof shape, "n=%ld", NC);
  ReportBytes("residual_forward", shape, 3.0 * NC * 2,
              MedianMs([&] { cu::residual_forward(z.p, x.p, y.p, NC, nullptr); }));
  ReportBytes("residual_backward", shape, 5.0 * NC * 2,
              MedianMs([&] { cu::residual_backward(dx.p, dw.p, dy.p, NC, nullptr); }));
  std::snprintf(shape, sizeof shape, "N=%ld V=%d Vp=%d", N, V, Vp);
  ReportBytes("crossentropy_forward", shape, 1.0 * N * V * 2, MedianMs([&] {
                cu::softmax_crossentropy_forward(losses.p, lse.p, logits.p, targets.p, N, V, Vp,
                                                 nullptr);
              }));
  ReportBytes("crossentropy_backward", shape, 3.0 * N * V * 2, MedianMs([&] {
                cu::softmax_crossentropy_backward(dlogits.p, logits.p, lse.p, targets.p, dlosses.p,
                                                  N, V, Vp, nullptr);
              }));
  const long P = 124L * 1000 * 1000;
  {
    Buf<float> master(P), mom(P), var(P);
    Buf<cu::bf16> params(P), grads(P);
    Buf<float> norm(1), partials(cu::launch::kGradNormBlocks);
    std::snprintf(shape, sizeof shape, "n=%ld", P);
    int t = 0;
    ReportBytes("adamw_update", shape, P * (3.0 * 4 * 2 + 2 + 2), MedianMs([&] {
                  cu::adamw_update(master.p, params.p, grads.p, mom.p, var.p, P, 1e-4f, 0.9f, 0.95f,
                                   1e-8f, 0.1f, ++t, 1.0f, nullptr);
                }));
    ReportBytes("sum_of_squares", shape, P * 2.0,
                MedianMs([&] { cu::sum_of_squares(norm.p, partials.p, grads.p, P, nullptr); }));
  }
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool bench = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bench") == 0) {
      bench = true;
    } else {
      std::fprintf(stderr, "usage: %s [--bench]\n", argv[0]);
      return 2;
    }
  }
  std::string why;
  if (!gc::DeviceAvailable(&why)) {
    std::printf("loom-gpu-op-check: no CUDA device (%s); nothing checked\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# device 0: %s, sm_%d%d, %.1f GiB\n", prop.name, prop.major, prop.minor,
              prop.totalGlobalMem / 1073741824.0);
  return bench ? RunBench() : RunChecks();
}
