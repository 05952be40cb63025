// CUDA ops against the double references. Contract: tests/gpu/op_checks.h.
//
// Accumulated gradients are checked by what the backward added: the buffers start from random
// values of about 6% of the gradient's RMS (so an op that overwrites instead of accumulating is
// off by about 6%, far above every tolerance), and (after - before) is compared with the
// reference gradient. Where the reference covers only some rows or batch elements, the rest of
// each output is still required to be finite (it was poisoned with NaN).
#include "tests/gpu/op_checks.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/crossentropy.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/grad_norm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/residual.h"
#include "kernels/ref/adamw_ref.h"
#include "kernels/ref/attention_ref.h"
#include "kernels/ref/crossentropy_ref.h"
#include "kernels/ref/encoder_ref.h"
#include "kernels/ref/gelu_ref.h"
#include "kernels/ref/grad_norm_ref.h"
#include "kernels/ref/layernorm_ref.h"
#include "kernels/ref/matmul_ref.h"
#include "kernels/ref/residual_ref.h"

namespace loom::gpu_check {
namespace {

namespace cu = ::loom::kernels::cuda;
namespace ref = ::loom::kernels::ref;
using cu::bf16;
using Bits = std::vector<std::uint16_t>;
using Doubles = std::vector<double>;

constexpr double kInf = std::numeric_limits<double>::infinity();

// splitmix64: fast enough for the hundreds of millions of values the 124M shapes need.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(Next() >> 40) * 0x1.0p-24);
  }
  // Uniform in [lo, hi_exclusive).
  int Int(int lo, int hi_exclusive) {
    return lo + static_cast<int>(Next() % static_cast<std::uint64_t>(hi_exclusive - lo));
  }

 private:
  std::uint64_t state_;
};

// A device buffer of n elements of T; host transfers by value type H of the same size.
template <typename T>
class Dev {
 public:
  explicit Dev(long n) : n_(n) {
    LOOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()));
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;

  T* get() const { return p_; }
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }
  // All bytes 0xFF: NaN for bf16 and fp32.
  void Poison() { LOOM_CUDA_CHECK(cudaMemset(p_, 0xFF, bytes())); }
  template <typename H>
  void Upload(const std::vector<H>& host, long offset = 0) {
    static_assert(sizeof(H) == sizeof(T));
    LOOM_CUDA_CHECK(
        cudaMemcpy(p_ + offset, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename H>
  std::vector<H> Download(long offset = 0, long count = -1) const {
    static_assert(sizeof(H) == sizeof(T));
    if (count < 0) count = n_ - offset;
    std::vector<H> host(count);
    LOOM_CUDA_CHECK(
        cudaMemcpy(host.data(), p_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  long n_;
};

// Waits for the device and reports any asynchronous fault where it surfaced.
void Sync() { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }

Bits RandomBits(Rng& rng, long n, float lo, float hi) {
  Bits v(n);
  for (auto& x : v) x = FloatToBf16Bits(rng.Uniform(lo, hi));
  return v;
}

std::vector<float> RandomFloats(Rng& rng, long n, float lo, float hi) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.Uniform(lo, hi);
  return v;
}

// Elements [offset, offset + count) of bf16 bits as doubles (count < 0: to the end).
Doubles ToDouble(const Bits& bits, long offset = 0, long count = -1) {
  if (count < 0) count = static_cast<long>(bits.size()) - offset;
  Doubles d(count);
  for (long i = 0; i < count; ++i) d[i] = Bf16BitsToFloat(bits[offset + i]);
  return d;
}

Doubles ToDouble(const std::vector<float>& v, long offset = 0, long count = -1) {
  if (count < 0) count = static_cast<long>(v.size()) - offset;
  return Doubles(v.begin() + offset, v.begin() + offset + count);
}

// after - before, elementwise.
Doubles Added(const Doubles& after, const Doubles& before) {
  Doubles d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

bool AllFinite(const Bits& bits) {
  for (std::uint16_t b : bits) {
    if ((b & 0x7f80) == 0x7f80) return false;  // exponent all ones: Inf or NaN
  }
  return true;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Start values for a gradient buffer whose reference increment is grad: uniform in +-0.1 x the
// RMS of grad's non-zero entries (about 6% RMS; see the file comment).
Bits GradInit(Rng& rng, const Doubles& grad, long n) {
  double sum = 0.0;
  long count = 0;
  for (double g : grad) {
    if (g != 0.0) {
      sum += g * g;
      ++count;
    }
  }
  const float scale = count > 0 ? static_cast<float>(0.1 * std::sqrt(sum / count)) : 0.1f;
  return RandomBits(rng, n, -scale, scale);
}

// Part p (0 q, 1 k, 2 v) of rows of (rows, 3C): (rows, C).
Doubles QkvPart(const Doubles& qkv, long rows, int C, int p) {
  Doubles out(rows * C);
  for (long r = 0; r < rows; ++r) {
    for (int c = 0; c < C; ++c) out[r * C + c] = qkv[r * 3 * C + p * C + c];
  }
  return out;
}

Result Make(const std::string& op, const std::string& shape, double error, double tolerance,
            const std::string& note = "") {
  Result r;
  r.op = op;
  r.shape = shape;
  r.error = error;
  r.tolerance = tolerance;
  r.note = note;
  return r;
}

// Fraction of positions where two bit patterns differ (0 when identical).
template <typename T>
double FractionDiffering(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size() || a.empty()) return kInf;
  long differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return static_cast<double>(differing) / a.size();
}

// Elementwise shape strings with the alignment variant.
std::string ElementwiseShape(long n, long offset) {
  std::ostringstream s;
  s << "n=" << n << (offset ? " unaligned" : "");
  return s.str();
}

}  // namespace

bool DeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    if (why) *why = "cudaGetDeviceCount returned 0";
    return false;
  }
  return true;
}

double RelativeError(const Doubles& out, const Doubles& reference) {
  if (out.size() != reference.size() || out.empty()) return kInf;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return kInf;
    diff += (out[i] - reference[i]) * (out[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  if (norm == 0.0) return kInf;
  return std::sqrt(diff / norm);
}

std::vector<Result> CheckCast(long n, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  for (long offset : {0L, 1L}) {
    const std::string shape = ElementwiseShape(n, offset);
    const std::vector<float> x = RandomFloats(rng, n, -3.0f, 3.0f);
    Dev<float> f(n + 1), back(n + 1);
    Dev<bf16> b(n + 1);
    f.Upload(x, offset);
    b.Poison();
    cu::cast_f32_to_bf16(b.get() + offset, f.get() + offset, n, nullptr);
    const Bits bits = b.Download<std::uint16_t>(offset, n);
    Bits host(n);
    for (long i = 0; i < n; ++i) host[i] = FloatToBf16Bits(x[i]);
    results.push_back(
        Make("cast_f32_to_bf16", shape, RelativeError(ToDouble(bits), ToDouble(x)), kTolBf16Store));
    results.push_back(Make("cast_f32_to_bf16.rne_bits", shape, FractionDiffering(bits, host), 1e-12,
                           "fraction differing from host round-to-nearest-even"));
    back.Poison();
    cu::cast_bf16_to_f32(back.get() + offset, b.get() + offset, n, nullptr);
    const std::vector<float> widened = back.Download<float>(offset, n);
    results.push_back(Make("cast_bf16_to_f32", shape,
                           RelativeError(ToDouble(widened), ToDouble(bits)), kTolFp32));
  }
  Sync();
  return results;
}

std::vector<Result> CheckResidual(long n, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  for (long offset : {0L, 1L}) {
    const std::string shape = ElementwiseShape(n, offset);
    const Bits a = RandomBits(rng, n, -1, 1), b = RandomBits(rng, n, -1, 1);
    const Bits dout = RandomBits(rng, n, -1, 1);
    Dev<bf16> da(n + 1), db(n + 1), dd(n + 1), dout_d(n + 1);
    da.Upload(a, offset);
    db.Upload(b, offset);
    dd.Poison();
    cu::residual_forward(dd.get() + offset, da.get() + offset, db.get() + offset, n, nullptr);
    const Doubles a_d = ToDouble(a), b_d = ToDouble(b);
    Doubles out_r(n);
    ref::residual_forward(out_r.data(), a_d.data(), b_d.data(), n);
    results.push_back(Make("residual_forward", shape,
                           RelativeError(ToDouble(dd.Download<std::uint16_t>(offset, n)), out_r),
                           kTolBf16Store));
    // Backward: da, db start from a, b (non-zero) and accumulate dout.
    const Doubles dout_dd = ToDouble(dout);
    Doubles ga(n, 0.0), gb(n, 0.0);
    ref::residual_backward(ga.data(), gb.data(), dout_dd.data(), n);
    const Bits ia = GradInit(rng, ga, n), ib = GradInit(rng, gb, n);
    da.Upload(ia, offset);
    db.Upload(ib, offset);
    dout_d.Upload(dout, offset);
    cu::residual_backward(da.get() + offset, db.get() + offset, dout_d.get() + offset, n, nullptr);
    results.push_back(Make(
        "residual_backward.da", shape,
        RelativeError(Added(ToDouble(da.Download<std::uint16_t>(offset, n)), ToDouble(ia)), ga),
        kTolBf16Store));
    results.push_back(Make(
        "residual_backward.db", shape,
        RelativeError(Added(ToDouble(db.Download<std::uint16_t>(offset, n)), ToDouble(ib)), gb),
        kTolBf16Store));
  }
  Sync();
  return results;
}

std::vector<Result> CheckGelu(long n, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  for (long offset : {0L, 1L}) {
    const std::string shape = ElementwiseShape(n, offset);
    const Bits x = RandomBits(rng, n, -4, 4), dout = RandomBits(rng, n, -1, 1);
    Dev<bf16> dx(n + 1), dy(n + 1), ddout(n + 1), dgrad(n + 1);
    dx.Upload(x, offset);
    dy.Poison();
    cu::gelu_forward(dy.get() + offset, dx.get() + offset, n, nullptr);
    const Doubles x_d = ToDouble(x), dout_d = ToDouble(dout);
    Doubles y_r(n);
    ref::gelu_forward(y_r.data(), x_d.data(), n);
    results.push_back(Make("gelu_forward", shape,
                           RelativeError(ToDouble(dy.Download<std::uint16_t>(offset, n)), y_r),
                           kTolBf16Store));
    Doubles g(n, 0.0);
    ref::gelu_backward(g.data(), x_d.data(), dout_d.data(), n);
    const Bits init = GradInit(rng, g, n);
    dgrad.Upload(init, offset);
    ddout.Upload(dout, offset);
    cu::gelu_backward(dgrad.get() + offset, dx.get() + offset, ddout.get() + offset, n, nullptr);
    results.push_back(Make(
        "gelu_backward", shape,
        RelativeError(Added(ToDouble(dgrad.Download<std::uint16_t>(offset, n)), ToDouble(init)), g),
        kTolBf16Store));
  }
  Sync();
  return results;
}

std::vector<Result> CheckEncoder(int B, int T, int C, int V, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "B=" << B << " T=" << T << " C=" << C << " V=" << V;
  const std::string shape = s.str();
  const long N = static_cast<long>(B) * T;
  const int maxT = T + 3;  // rows of wpe beyond T must stay untouched
  std::vector<int> tokens(N);
  // Odd positions draw from a few ids, so tokens repeat often (the backward's hard case).
  for (long i = 0; i < N; ++i) tokens[i] = rng.Int(0, i % 2 ? std::min(V, 8) : V);
  const Bits wte = RandomBits(rng, static_cast<long>(V) * C, -1, 1);
  const Bits wpe = RandomBits(rng, static_cast<long>(maxT) * C, -1, 1);
  Dev<int> tok_d(N);
  Dev<bf16> wte_d(static_cast<long>(V) * C), wpe_d(static_cast<long>(maxT) * C), out_d(N * C);
  tok_d.Upload(tokens);
  wte_d.Upload(wte);
  wpe_d.Upload(wpe);
  out_d.Poison();
  cu::encoder_forward(out_d.get(), tok_d.get(), wte_d.get(), wpe_d.get(), B, T, C, nullptr);
  {
    const Doubles wte_r = ToDouble(wte), wpe_r = ToDouble(wpe);
    Doubles out_r(N * C);
    ref::encoder_forward(out_r.data(), tokens.data(), wte_r.data(), wpe_r.data(), B, T, C);
    results.push_back(Make("encoder_forward", shape,
                           RelativeError(ToDouble(out_d.Download<std::uint16_t>()), out_r),
                           kTolBf16Store));
  }
  const Bits dout = RandomBits(rng, N * C, -1, 1);
  const Doubles dout_r = ToDouble(dout);
  Doubles gwte(static_cast<long>(V) * C, 0.0), gwpe(static_cast<long>(maxT) * C, 0.0);
  ref::encoder_backward(gwte.data(), gwpe.data(), dout_r.data(), tokens.data(), B, T, C);
  const Bits iwte = GradInit(rng, gwte, gwte.size()), iwpe = GradInit(rng, gwpe, gwpe.size());
  Dev<bf16> dout_d(N * C);
  dout_d.Upload(dout);
  wte_d.Upload(iwte);  // reused as the gradient buffers
  wpe_d.Upload(iwpe);
  cu::encoder_backward(wte_d.get(), wpe_d.get(), dout_d.get(), tok_d.get(), B, T, C, nullptr);
  results.push_back(
      Make("encoder_backward.dwte", shape,
           RelativeError(Added(ToDouble(wte_d.Download<std::uint16_t>()), ToDouble(iwte)), gwte),
           kTolBf16Store));
  results.push_back(
      Make("encoder_backward.dwpe", shape,
           RelativeError(Added(ToDouble(wpe_d.Download<std::uint16_t>()), ToDouble(iwpe)), gwpe),
           kTolBf16Store));
  Sync();
  return results;
}

std::vector<Result> CheckLayerNorm(int N, int C, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "N=" << N << " C=" << C;
  const std::string shape = s.str();
  const long NC = static_cast<long>(N) * C;
  // Inputs off-centre, so the means are far from 0 and their relative error is meaningful.
  const Bits a = RandomBits(rng, NC, -1.0f, 2.0f), b = RandomBits(rng, NC, -1.0f, 1.0f);
  const Bits w = RandomBits(rng, C, -1.5f, 1.5f), bias = RandomBits(rng, C, -1.0f, 1.0f);
  Dev<bf16> a_d(NC), b_d(NC), w_d(C), bias_d(C), out_d(NC), res_d(NC), out2_d(NC), res2_d(NC);
  Dev<float> mean_d(N), rstd_d(N), mean2_d(N), rstd2_d(N);
  a_d.Upload(a);
  b_d.Upload(b);
  w_d.Upload(w);
  bias_d.Upload(bias);
  out_d.Poison();
  mean_d.Poison();
  rstd_d.Poison();
  cu::layernorm_forward(out_d.get(), mean_d.get(), rstd_d.get(), a_d.get(), w_d.get(), bias_d.get(),
                        N, C, nullptr);
  const Doubles a_r = ToDouble(a), b_r = ToDouble(b), w_r = ToDouble(w), bias_r = ToDouble(bias);
  Doubles out_r(NC), mean_r(N), rstd_r(N);
  ref::layernorm_forward(out_r.data(), mean_r.data(), rstd_r.data(), a_r.data(), w_r.data(),
                         bias_r.data(), N, C);
  results.push_back(Make("layernorm_forward.out", shape,
                         RelativeError(ToDouble(out_d.Download<std::uint16_t>()), out_r),
                         kTolBf16Store));
  results.push_back(Make("layernorm_forward.mean", shape,
                         RelativeError(ToDouble(mean_d.Download<float>()), mean_r), kTolLoss));
  results.push_back(Make("layernorm_forward.rstd", shape,
                         RelativeError(ToDouble(rstd_d.Download<float>()), rstd_r), kTolLoss));

  // Fused residual + layernorm: against the reference of the exact sum, and bit for bit
  // against residual_forward followed by layernorm_forward.
  res_d.Poison();
  out2_d.Poison();
  cu::residual_layernorm_forward(res_d.get(), out2_d.get(), mean2_d.get(), rstd2_d.get(), a_d.get(),
                                 b_d.get(), w_d.get(), bias_d.get(), N, C, nullptr);
  {
    Doubles sum_r(NC), fused_r(NC), m_r(N), s_r(N);
    ref::residual_forward(sum_r.data(), a_r.data(), b_r.data(), NC);
    ref::layernorm_forward(fused_r.data(), m_r.data(), s_r.data(), sum_r.data(), w_r.data(),
                           bias_r.data(), N, C);
    const Bits fused = out2_d.Download<std::uint16_t>(), res = res_d.Download<std::uint16_t>();
    results.push_back(Make("residual_layernorm_forward.residual", shape,
                           RelativeError(ToDouble(res), sum_r), kTolBf16Store));
    results.push_back(Make("residual_layernorm_forward.out", shape,
                           RelativeError(ToDouble(fused), fused_r), kTolBf16Gemm,
                           "normalises the bf16-rounded sum"));
    res2_d.Poison();
    cu::residual_forward(res2_d.get(), a_d.get(), b_d.get(), NC, nullptr);
    out_d.Poison();
    cu::layernorm_forward(out_d.get(), mean_d.get(), rstd_d.get(), res2_d.get(), w_d.get(),
                          bias_d.get(), N, C, nullptr);
    results.push_back(Make("residual_layernorm_forward.vs_unfused", shape,
                           FractionDiffering(fused, out_d.Download<std::uint16_t>()), 1e-12,
                           "fraction of outputs differing from the unfused pair"));
  }

  // Backward at the first forward's input, with the device's mean and rstd.
  cu::layernorm_forward(out_d.get(), mean_d.get(), rstd_d.get(), a_d.get(), w_d.get(), bias_d.get(),
                        N, C, nullptr);
  const Bits dout = RandomBits(rng, NC, -1, 1);
  const Doubles dout_r = ToDouble(dout);
  Doubles gx(NC, 0.0), gw(C, 0.0), gb(C, 0.0);
  ref::layernorm_backward(gx.data(), gw.data(), gb.data(), dout_r.data(), a_r.data(), w_r.data(),
                          mean_r.data(), rstd_r.data(), N, C);
  const Bits ix = GradInit(rng, gx, NC), iw = GradInit(rng, gw, C), ib = GradInit(rng, gb, C);
  Dev<bf16> dout_d(NC), dx_d(NC), dw_d(C), db_d(C);
  Dev<float> scratch(cu::launch::LayerNormBackwardScratchFloats(N, C));
  dout_d.Upload(dout);
  dx_d.Upload(ix);
  dw_d.Upload(iw);
  db_d.Upload(ib);
  scratch.Poison();
  cu::layernorm_backward(dx_d.get(), dw_d.get(), db_d.get(), scratch.get(), dout_d.get(), a_d.get(),
                         w_d.get(), mean_d.get(), rstd_d.get(), N, C, nullptr);
  results.push_back(
      Make("layernorm_backward.dinp", shape,
           RelativeError(Added(ToDouble(dx_d.Download<std::uint16_t>()), ToDouble(ix)), gx),
           kTolBf16Gemm));
  results.push_back(
      Make("layernorm_backward.dweight", shape,
           RelativeError(Added(ToDouble(dw_d.Download<std::uint16_t>()), ToDouble(iw)), gw),
           kTolBf16Gemm));
  results.push_back(
      Make("layernorm_backward.dbias", shape,
           RelativeError(Added(ToDouble(db_d.Download<std::uint16_t>()), ToDouble(ib)), gb),
           kTolBf16Gemm));
  Sync();
  return results;
}

std::vector<Result> CheckMatmulForward(cu::GemmContext& ctx, int N, int C, int OC, bool bias,
                                       bool gelu, int ref_rows, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "N=" << N << " C=" << C << " OC=" << OC << (bias ? " +bias" : "") << (gelu ? " +gelu" : "");
  const std::string shape = s.str();
  const int R = std::min(N, ref_rows);
  const std::string note =
      R < N ? "reference on the first " + std::to_string(R) + " rows; all rows finite" : "";
  const long NOC = static_cast<long>(N) * OC;
  const Bits inp = RandomBits(rng, static_cast<long>(N) * C, -1, 1);
  const Bits w = RandomBits(rng, static_cast<long>(OC) * C, -1, 1);
  const Bits b = RandomBits(rng, OC, -1, 1);
  Dev<bf16> inp_d(static_cast<long>(N) * C), w_d(static_cast<long>(OC) * C), b_d(OC), out_d(NOC),
      pre_d(NOC);
  inp_d.Upload(inp);
  w_d.Upload(w);
  b_d.Upload(b);
  out_d.Poison();
  pre_d.Poison();
  if (gelu) {
    cu::matmul_gelu_forward(ctx, out_d.get(), pre_d.get(), inp_d.get(), w_d.get(),
                            bias ? b_d.get() : nullptr, N, C, OC, nullptr);
  } else {
    cu::matmul_forward(ctx, out_d.get(), inp_d.get(), w_d.get(), bias ? b_d.get() : nullptr, N, C,
                       OC, nullptr);
  }
  const Doubles inp_r = ToDouble(inp, 0, static_cast<long>(R) * C), w_r = ToDouble(w),
                b_r = ToDouble(b);
  Doubles pre_r(static_cast<long>(R) * OC);
  ref::matmul_forward(pre_r.data(), inp_r.data(), w_r.data(), bias ? b_r.data() : nullptr, R, C,
                      OC);
  const Bits out = out_d.Download<std::uint16_t>();
  const Doubles out_head = ToDouble(out, 0, static_cast<long>(R) * OC);
  if (gelu) {
    Doubles gelu_r(pre_r.size());
    ref::gelu_forward(gelu_r.data(), pre_r.data(), static_cast<long>(pre_r.size()));
    results.push_back(Make("matmul_gelu_forward.out", shape,
                           AllFinite(out) ? RelativeError(out_head, gelu_r) : kInf, kTolBf16Gemm,
                           note));
    const Bits pre = pre_d.Download<std::uint16_t>();
    results.push_back(Make(
        "matmul_gelu_forward.pre_gelu", shape,
        AllFinite(pre) ? RelativeError(ToDouble(pre, 0, static_cast<long>(R) * OC), pre_r) : kInf,
        kTolBf16Gemm, note));
  } else {
    results.push_back(Make("matmul_forward", shape,
                           AllFinite(out) ? RelativeError(out_head, pre_r) : kInf, kTolBf16Gemm,
                           note));
  }
  Sync();
  return results;
}

std::vector<Result> CheckMatmulBackward(cu::GemmContext& ctx, int N, int C, int OC, bool bias,
                                        std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "N=" << N << " C=" << C << " OC=" << OC << (bias ? " +bias" : "");
  const std::string shape = s.str();
  const long NC = static_cast<long>(N) * C, OCC = static_cast<long>(OC) * C;
  const long NOC = static_cast<long>(N) * OC;
  const Bits inp = RandomBits(rng, NC, -1, 1), w = RandomBits(rng, OCC, -1, 1);
  const Bits dout = RandomBits(rng, NOC, -1, 1);
  const Doubles inp_r = ToDouble(inp), w_r = ToDouble(w), dout_r = ToDouble(dout);
  Doubles gx(NC, 0.0), gw(OCC, 0.0), gb(OC, 0.0);
  ref::matmul_backward(gx.data(), gw.data(), bias ? gb.data() : nullptr, dout_r.data(),
                       inp_r.data(), w_r.data(), N, C, OC);
  const Bits ix = GradInit(rng, gx, NC), iw = GradInit(rng, gw, OCC);
  const Bits ib = bias ? GradInit(rng, gb, OC) : Bits(OC, 0);
  Dev<bf16> inp_d(NC), w_d(OCC), dout_d(NOC), dx_d(NC), dw_d(OCC), db_d(OC);
  inp_d.Upload(inp);
  w_d.Upload(w);
  dout_d.Upload(dout);
  dx_d.Upload(ix);
  dw_d.Upload(iw);
  db_d.Upload(ib);
  cu::matmul_backward(ctx, dx_d.get(), dw_d.get(), bias ? db_d.get() : nullptr, dout_d.get(),
                      inp_d.get(), w_d.get(), N, C, OC, nullptr);
  results.push_back(
      Make("matmul_backward.dinp", shape,
           RelativeError(Added(ToDouble(dx_d.Download<std::uint16_t>()), ToDouble(ix)), gx),
           kTolBf16Gemm));
  results.push_back(
      Make("matmul_backward.dweight", shape,
           RelativeError(Added(ToDouble(dw_d.Download<std::uint16_t>()), ToDouble(iw)), gw),
           kTolBf16Gemm));
  if (bias) {
    results.push_back(
        Make("matmul_backward.dbias", shape,
             RelativeError(Added(ToDouble(db_d.Download<std::uint16_t>()), ToDouble(ib)), gb),
             kTolBf16Gemm));
  }
  Sync();
  return results;
}

// The three parts (dq, dk, dv) of an attention backward's qkv gradient against the reference
// g: `dqkv` as downloaded, minus the `init` it accumulated onto, on the first `rows` rows.
void AddQkvGradResults(std::vector<Result>* results, const std::string& op,
                       const std::string& shape, const std::string& note, const Bits& dqkv,
                       const Bits& init, const Doubles& g, long rows, int C) {
  const long n = rows * 3 * C;
  const bool finite = AllFinite(dqkv);
  const Doubles added = Added(ToDouble(dqkv, 0, n), ToDouble(init, 0, n));
  const char* parts[3] = {".dq", ".dk", ".dv"};
  for (int p = 0; p < 3; ++p) {
    results->push_back(
        Make(op + parts[p], shape,
             finite ? RelativeError(QkvPart(added, rows, C, p), QkvPart(g, rows, C, p)) : kInf,
             kTolBf16Gemm, note));
  }
}

std::vector<Result> CheckAttention(cu::GemmContext& ctx, int B, int T, int C, int NH,
                                   int ref_batches, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
  const std::string shape = s.str();
  const int RB = std::min(B, ref_batches);
  const std::string note =
      RB < B ? "reference on the first " + std::to_string(RB) + " of B; all finite" : "";
  const long TT = static_cast<long>(T) * T;
  const long n_qkv = static_cast<long>(B) * T * 3 * C, n_out = static_cast<long>(B) * T * C;
  const long n_att = static_cast<long>(B) * NH * TT;
  const long r_qkv = static_cast<long>(RB) * T * 3 * C, r_out = static_cast<long>(RB) * T * C;
  const long r_att = static_cast<long>(RB) * NH * TT;
  const Bits qkv = RandomBits(rng, n_qkv, -1.5f, 1.5f);
  Dev<bf16> qkv_d(n_qkv), out_d(n_out), att_d(n_att);
  Dev<char> scratch(static_cast<long>(cu::launch::AttentionScratchBytes(T, NH)));
  qkv_d.Upload(qkv);
  out_d.Poison();
  att_d.Poison();
  scratch.Poison();
  cu::attention_forward(ctx, out_d.get(), att_d.get(), scratch.get(), qkv_d.get(), B, T, C, NH,
                        nullptr);
  const Doubles qkv_r = ToDouble(qkv, 0, r_qkv);
  Doubles out_r(r_out), att_r(r_att);
  ref::attention_forward(out_r.data(), att_r.data(), qkv_r.data(), RB, T, C, NH);
  const Bits out = out_d.Download<std::uint16_t>(), att = att_d.Download<std::uint16_t>();
  results.push_back(Make("attention_forward.out", shape,
                         AllFinite(out) ? RelativeError(ToDouble(out, 0, r_out), out_r) : kInf,
                         kTolBf16Gemm, note));
  results.push_back(Make("attention_forward.att", shape,
                         AllFinite(att) ? RelativeError(ToDouble(att, 0, r_att), att_r) : kInf,
                         kTolBf16Gemm, note));

  const Bits dout = RandomBits(rng, n_out, -1, 1);
  const Doubles dout_r = ToDouble(dout, 0, r_out);
  Doubles g(r_qkv, 0.0), ref_scratch(r_att);
  ref::attention_backward(g.data(), ref_scratch.data(), dout_r.data(), qkv_r.data(), att_r.data(),
                          RB, T, C, NH);
  const Bits init = GradInit(rng, g, n_qkv);
  Dev<bf16> dout_d(n_out), dqkv_d(n_qkv);
  dout_d.Upload(dout);
  dqkv_d.Upload(init);
  scratch.Poison();
  cu::attention_backward(ctx, dqkv_d.get(), scratch.get(), dout_d.get(), qkv_d.get(), att_d.get(),
                         B, T, C, NH, nullptr);
  AddQkvGradResults(&results, "attention_backward", shape, note, dqkv_d.Download<std::uint16_t>(),
                    init, g, static_cast<long>(RB) * T, C);
  Sync();
  return results;
}

std::vector<Result> CheckFlashAttention(int B, int T, int C, int NH, int ref_batches,
                                        std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
  const std::string shape = s.str();
  const int RB = std::min(B, ref_batches);
  const std::string note =
      RB < B ? "reference on the first " + std::to_string(RB) + " of B; all finite" : "";
  const int HS = C / NH;
  const long n_qkv = static_cast<long>(B) * T * 3 * C, n_out = static_cast<long>(B) * T * C;
  const long n_lse = static_cast<long>(B) * NH * T;
  const long r_qkv = static_cast<long>(RB) * T * 3 * C, r_out = static_cast<long>(RB) * T * C;
  const long r_lse = static_cast<long>(RB) * NH * T;
  const Bits qkv = RandomBits(rng, n_qkv, -1.5f, 1.5f);
  Dev<bf16> qkv_d(n_qkv), out_d(n_out);
  Dev<float> lse_d(n_lse);
  qkv_d.Upload(qkv);
  out_d.Poison();
  lse_d.Poison();
  cu::flash_attention_forward(out_d.get(), lse_d.get(), qkv_d.get(), B, T, C, NH, nullptr);
  const Doubles qkv_r = ToDouble(qkv, 0, r_qkv);
  Doubles out_r(r_out), att_r(r_lse * T), lse_r(r_lse);
  ref::attention_forward(out_r.data(), att_r.data(), qkv_r.data(), RB, T, C, NH);
  // lse of row (b, h, t): log sum_j<=t exp(scale q_t . k_j), in double from the same inputs.
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (long b = 0; b < RB; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const double* q = qkv_r.data() + (b * T + t) * 3 * C + h * HS;
        std::vector<double> z(t + 1);
        double mx = -kInf;
        for (int j = 0; j <= t; ++j) {
          const double* k = qkv_r.data() + (b * T + j) * 3 * C + C + h * HS;
          double dot = 0;
          for (int c = 0; c < HS; ++c) dot += q[c] * k[c];
          z[j] = dot * scale;
          mx = std::max(mx, z[j]);
        }
        double sum = 0;
        for (double v : z) sum += std::exp(v - mx);
        lse_r[(b * NH + h) * T + t] = mx + std::log(sum);
      }
    }
  }
  const Bits out = out_d.Download<std::uint16_t>();
  const std::vector<float> lse = lse_d.Download<float>();
  results.push_back(Make("flash_attention_forward.out", shape,
                         AllFinite(out) ? RelativeError(ToDouble(out, 0, r_out), out_r) : kInf,
                         kTolBf16Gemm, note));
  results.push_back(Make("flash_attention_forward.lse", shape,
                         AllFinite(lse) ? RelativeError(ToDouble(lse, 0, r_lse), lse_r) : kInf,
                         kTolBf16Gemm, note));

  const Bits dout = RandomBits(rng, n_out, -1, 1);
  const Doubles dout_r = ToDouble(dout, 0, r_out);
  Doubles g(r_qkv, 0.0), ref_scratch(r_lse * T);
  ref::attention_backward(g.data(), ref_scratch.data(), dout_r.data(), qkv_r.data(), att_r.data(),
                          RB, T, C, NH);
  const Bits init = GradInit(rng, g, n_qkv);
  Dev<bf16> dout_d(n_out), dqkv_d(n_qkv);
  Dev<char> scratch(static_cast<long>(cu::launch::FlashAttentionScratchBytes(B, T, NH)));
  dout_d.Upload(dout);
  dqkv_d.Upload(init);
  scratch.Poison();
  cu::flash_attention_backward(dqkv_d.get(), scratch.get(), dout_d.get(), out_d.get(), qkv_d.get(),
                               lse_d.get(), B, T, C, NH, nullptr);
  AddQkvGradResults(&results, "flash_attention_backward", shape, note,
                    dqkv_d.Download<std::uint16_t>(), init, g, static_cast<long>(RB) * T, C);
  Sync();
  return results;
}

std::vector<Result> CheckCrossEntropy(int N, int V, int Vp, int ref_rows, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  std::ostringstream s;
  s << "N=" << N << " V=" << V << " Vp=" << Vp;
  const std::string shape = s.str();
  const int R = std::min(N, ref_rows);
  const std::string note =
      R < N ? "reference on the first " + std::to_string(R) + " rows; all finite" : "";
  const long NV = static_cast<long>(N) * Vp;
  Bits logits = RandomBits(rng, NV, -4, 4);
  // Padding columns hold huge logits: an op that reads them gets every loss wrong.
  for (long n = 0; n < N; ++n) {
    for (int j = V; j < Vp; ++j) logits[n * Vp + j] = FloatToBf16Bits(100.0f);
  }
  std::vector<int> targets(N);
  for (auto& t : targets) t = rng.Int(0, V);
  Dev<bf16> logits_d(NV), dlogits_d(NV);
  Dev<int> targets_d(N);
  Dev<float> losses_d(N), lse_d(N), dlosses_d(N);
  logits_d.Upload(logits);
  targets_d.Upload(targets);
  losses_d.Poison();
  lse_d.Poison();
  cu::softmax_crossentropy_forward(losses_d.get(), lse_d.get(), logits_d.get(), targets_d.get(), N,
                                   V, Vp, nullptr);
  // Reference on rows [0, R), columns [0, V).
  Doubles z_r(static_cast<long>(R) * V);
  for (long n = 0; n < R; ++n) {
    for (int j = 0; j < V; ++j) z_r[n * V + j] = Bf16BitsToFloat(logits[n * Vp + j]);
  }
  Doubles losses_r(R), probs_r(static_cast<long>(R) * V), lse_r(R);
  ref::softmax_crossentropy_forward(losses_r.data(), probs_r.data(), z_r.data(), targets.data(), R,
                                    V);
  for (long n = 0; n < R; ++n) lse_r[n] = losses_r[n] + z_r[n * V + targets[n]];
  const std::vector<float> losses = losses_d.Download<float>(), lse = lse_d.Download<float>();
  results.push_back(Make("crossentropy_forward.losses", shape,
                         AllFinite(losses) ? RelativeError(ToDouble(losses, 0, R), losses_r) : kInf,
                         kTolLoss, note));
  results.push_back(Make("crossentropy_forward.lse", shape,
                         AllFinite(lse) ? RelativeError(ToDouble(lse, 0, R), lse_r) : kInf,
                         kTolLoss, note));

  std::vector<float> dlosses(N);
  for (auto& d : dlosses) d = rng.Uniform(0.5f, 1.5f) / N;
  Doubles g(static_cast<long>(R) * V, 0.0), dlosses_r = ToDouble(dlosses, 0, R);
  ref::softmax_crossentropy_backward(g.data(), probs_r.data(), targets.data(), dlosses_r.data(), R,
                                     V);
  const Bits init = GradInit(rng, g, NV);
  dlogits_d.Upload(init);
  dlosses_d.Upload(dlosses);
  cu::softmax_crossentropy_backward(dlogits_d.get(), logits_d.get(), lse_d.get(), targets_d.get(),
                                    dlosses_d.get(), N, V, Vp, nullptr);
  const Bits dlogits = dlogits_d.Download<std::uint16_t>();
  // Compare rows [0, R) over all Vp columns: the padding must receive nothing.
  Doubles added(static_cast<long>(R) * Vp), expected(static_cast<long>(R) * Vp, 0.0);
  for (long n = 0; n < R; ++n) {
    for (int j = 0; j < Vp; ++j) {
      const long i = n * Vp + j;
      added[i] = static_cast<double>(Bf16BitsToFloat(dlogits[i])) - Bf16BitsToFloat(init[i]);
      if (j < V) expected[i] = g[n * V + j];
    }
  }
  results.push_back(Make("crossentropy_backward.dlogits", shape,
                         AllFinite(dlogits) ? RelativeError(added, expected) : kInf, kTolBf16Store,
                         note));
  Sync();
  return results;
}

std::vector<Result> CheckAdamW(long n, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  const std::string shape = "n=" + std::to_string(n);
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.7f;
  const int t = 3;
  const std::vector<float> master = RandomFloats(rng, n, -1, 1);
  const std::vector<float> m = RandomFloats(rng, n, -0.1f, 0.1f);
  const std::vector<float> v = RandomFloats(rng, n, 0.0f, 0.02f);
  const Bits grads = RandomBits(rng, n, -1, 1);
  Dev<float> master_d(n), m_d(n), v_d(n);
  Dev<bf16> grads_d(n), params_d(n);
  master_d.Upload(master);
  m_d.Upload(m);
  v_d.Upload(v);
  grads_d.Upload(grads);
  params_d.Poison();
  cu::adamw_update(master_d.get(), params_d.get(), grads_d.get(), m_d.get(), v_d.get(), n, lr,
                   beta1, beta2, eps, wd, t, scale, nullptr);
  Doubles master_r = ToDouble(master), m_r = ToDouble(m), v_r = ToDouble(v);
  Doubles g_r = ToDouble(grads);
  for (double& g : g_r) g *= double{scale};
  ref::adamw_update(master_r.data(), g_r.data(), m_r.data(), v_r.data(), n, lr, beta1, beta2, eps,
                    wd, t);
  const Doubles master_out = ToDouble(master_d.Download<float>());
  results.push_back(Make("adamw.master", shape, RelativeError(master_out, master_r), kTolFp32));
  results.push_back(
      Make("adamw.update", shape,
           RelativeError(Added(master_out, ToDouble(master)), Added(master_r, ToDouble(master))),
           kTolLoss, "master after - before"));
  results.push_back(
      Make("adamw.m", shape, RelativeError(ToDouble(m_d.Download<float>()), m_r), kTolFp32));
  results.push_back(
      Make("adamw.v", shape, RelativeError(ToDouble(v_d.Download<float>()), v_r), kTolFp32));
  results.push_back(Make("adamw.params_bf16", shape,
                         RelativeError(ToDouble(params_d.Download<std::uint16_t>()), master_r),
                         kTolBf16Store));
  Sync();
  return results;
}

std::vector<Result> CheckGradNorm(long n, std::uint64_t seed) {
  std::vector<Result> results;
  Rng rng(seed);
  const std::string shape = "n=" + std::to_string(n);
  const Bits x = RandomBits(rng, n, -1, 1);
  Dev<bf16> x_d(n);
  Dev<float> out_d(2), partials(cu::launch::kGradNormBlocks);
  x_d.Upload(x);
  out_d.Poison();
  partials.Poison();
  cu::sum_of_squares(out_d.get(), partials.get(), x_d.get(), n, nullptr);
  cu::sum_of_squares(out_d.get() + 1, partials.get(), x_d.get(), n, nullptr);
  const std::vector<float> out = out_d.Download<float>();
  const Doubles x_r = ToDouble(x);
  const double sum_r = ref::sum_of_squares(x_r.data(), n);
  results.push_back(
      Make("sum_of_squares", shape, RelativeError({double{out[0]}}, {sum_r}), kTolFp32));
  results.push_back(Make("sum_of_squares.repeat", shape,
                         FractionDiffering(std::vector<float>{out[0]}, std::vector<float>{out[1]}),
                         1e-12, "two runs must agree bit for bit"));
  Sync();
  return results;
}

}  // namespace loom::gpu_check
