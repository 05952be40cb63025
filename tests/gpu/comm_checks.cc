#include "tests/gpu/comm_checks.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>

#include "kernels/cuda/check.h"
#include "tests/gpu/bf16_bits.h"

namespace loom::gpu_check {
namespace {

using train::DeviceDType;
using train::NcclCommunicator;
using train::WorkHandle;

// Rank r's element i: (r + 1) * (i % 5 + 1). Every partial sum over up to 8 ranks is an integer
// below 256, exact in bf16 as in fp32, whatever order the reduction adds in.
float Pattern(int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 5 + 1)); }
// The sum of Pattern(r, i) over ranks 0..n-1.
float PatternSum(int n, size_t i) { return static_cast<float>(n * (n + 1) / 2 * (i % 5 + 1)); }

// A device buffer for one operation (cudaMalloc: a test program, not the trainer's allocator).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { LOOM_CUDA_CHECK(cudaMalloc(&p_, bytes)); }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f32() { return static_cast<float*>(p_); }
  void* raw() { return p_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

void Upload(void* dst, const void* src, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void Download(void* dst, const void* src, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

// Fills the inputs, runs the operation once and counts wrong elements (check), then times
// `iters` back-to-back operations after `warmup` (the data is not reset between them: the
// timing does not depend on the values).
CommResult Measure(const std::string& op, size_t bytes, size_t elements, int ranks,
                   const CommCheckOptions& o, const std::function<void()>& fill,
                   const std::function<WorkHandle()>& issue, const std::function<long()>& check) {
  CommResult r;
  r.op = op;
  r.bytes = bytes;
  r.elements = elements;
  fill();
  issue()->Wait();
  r.wrong = check();
  std::vector<WorkHandle> pending;
  for (int i = 0; i < o.warmup; ++i) pending.push_back(issue());
  for (WorkHandle& w : pending) w->Wait();
  pending.clear();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) pending.push_back(issue());
  for (WorkHandle& w : pending) w->Wait();
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.seconds = total / std::max(o.iters, 1);
  r.algbw = r.seconds > 0 ? static_cast<double>(bytes) / r.seconds / 1e9 : 0.0;
  r.busbw = r.algbw * BusFactor(op, ranks);
  return r;
}

}  // namespace

double BusFactor(const std::string& op, int ranks) {
  const double n = ranks;
  if (op.rfind("all_reduce", 0) == 0) return ranks > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (op == "reduce_scatter" || op == "all_gather") return ranks > 1 ? (n - 1) / n : 0.0;
  return 1.0;  // send_recv
}

std::vector<CommResult> RunCommChecks(NcclCommunicator* comm, const CommCheckOptions& o) {
  const int W = comm->size(), me = comm->rank();
  std::vector<CommResult> out;
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes *= static_cast<size_t>(std::max(o.factor, 2))) {
    // ---- all-reduce, fp32 then bf16 (in place) ----
    {
      const size_t n = bytes / sizeof(float);
      DeviceBuffer data(n * sizeof(float));
      std::vector<float> host(n);
      out.push_back(Measure(
          "all_reduce_f32", n * sizeof(float), n, W, o,
          [&] {
            for (size_t i = 0; i < n; ++i) host[i] = Pattern(me, i);
            Upload(data.raw(), host.data(), n * sizeof(float));
          },
          [&] { return comm->AllReduceSum(data.f32(), n); },
          [&] {
            Download(host.data(), data.raw(), n * sizeof(float));
            long wrong = 0;
            for (size_t i = 0; i < n; ++i) wrong += host[i] != PatternSum(W, i);
            return wrong;
          }));
      const size_t m = bytes / sizeof(uint16_t);
      std::vector<uint16_t> h16(m);
      DeviceBuffer d16(m * sizeof(uint16_t));
      out.push_back(Measure(
          "all_reduce_bf16", m * sizeof(uint16_t), m, W, o,
          [&] {
            for (size_t i = 0; i < m; ++i) h16[i] = FloatToBf16Bits(Pattern(me, i));
            Upload(d16.raw(), h16.data(), m * sizeof(uint16_t));
          },
          [&] { return comm->AllReduceSum(d16.raw(), m, DeviceDType::kBFloat16); },
          [&] {
            Download(h16.data(), d16.raw(), m * sizeof(uint16_t));
            long wrong = 0;
            for (size_t i = 0; i < m; ++i) wrong += Bf16BitsToFloat(h16[i]) != PatternSum(W, i);
            return wrong;
          }));
    }
    // ---- reduce-scatter: (W, n) in, rank r receives block r summed ----
    {
      const size_t n = bytes / sizeof(float) / W;
      if (n > 0) {
        DeviceBuffer in(W * n * sizeof(float)), res(n * sizeof(float));
        std::vector<float> host(W * n);
        out.push_back(Measure(
            "reduce_scatter", W * n * sizeof(float), n, W, o,
            [&] {
              for (size_t i = 0; i < W * n; ++i) host[i] = Pattern(me, i);
              Upload(in.raw(), host.data(), W * n * sizeof(float));
            },
            [&] { return comm->ReduceScatterSum(in.f32(), res.f32(), n); },
            [&] {
              std::vector<float> got(n);
              Download(got.data(), res.raw(), n * sizeof(float));
              long wrong = 0;
              for (size_t j = 0; j < n; ++j) wrong += got[j] != PatternSum(W, me * n + j);
              return wrong;
            }));
      }
    }
    // ---- all-gather: n in, (W, n) out ----
    {
      const size_t n = bytes / sizeof(float) / W;
      if (n > 0) {
        DeviceBuffer in(n * sizeof(float)), res(W * n * sizeof(float));
        std::vector<float> host(n);
        out.push_back(Measure(
            "all_gather", W * n * sizeof(float), n, W, o,
            [&] {
              for (size_t i = 0; i < n; ++i) host[i] = Pattern(me, i);
              Upload(in.raw(), host.data(), n * sizeof(float));
              LOOM_CUDA_CHECK(cudaMemset(res.raw(), 0xff, W * n * sizeof(float)));  // NaNs
            },
            [&] { return comm->AllGather(in.f32(), res.f32(), n); },
            [&] {
              std::vector<float> got(W * n);
              Download(got.data(), res.raw(), W * n * sizeof(float));
              long wrong = 0;
              for (int b = 0; b < W; ++b) {
                for (size_t j = 0; j < n; ++j) wrong += got[b * n + j] != Pattern(b, j);
              }
              return wrong;
            }));
      }
    }
    // ---- send/recv around the ring: to rank + 1, from rank - 1 ----
    if (W > 1) {
      const size_t n = bytes / sizeof(float);
      DeviceBuffer send(n * sizeof(float)), recv(n * sizeof(float));
      std::vector<float> host(n);
      const int dst = (me + 1) % W, src = (me + W - 1) % W;
      out.push_back(Measure(
          "send_recv", n * sizeof(float), n, W, o,
          [&] {
            for (size_t i = 0; i < n; ++i) host[i] = Pattern(me, i);
            Upload(send.raw(), host.data(), n * sizeof(float));
            LOOM_CUDA_CHECK(cudaMemset(recv.raw(), 0xff, n * sizeof(float)));
          },
          [&] { return comm->SendRecv(send.f32(), n, dst, recv.f32(), n, src); },
          [&] {
            Download(host.data(), recv.raw(), n * sizeof(float));
            long wrong = 0;
            for (size_t i = 0; i < n; ++i) wrong += host[i] != Pattern(src, i);
            return wrong;
          }));
    }
  }
  return out;
}

std::string FormatCommTable(const std::vector<CommResult>& results, int ranks) {
  std::string s;
  char line[200];
  std::snprintf(line, sizeof line, "%-16s %12s %12s %11s %10s %10s %8s\n", "op", "bytes",
                "elements", "time (us)", "algbw GB/s", "busbw GB/s", "wrong");
  s += line;
  for (const CommResult& r : results) {
    std::snprintf(line, sizeof line, "%-16s %12zu %12zu %11.1f %10.2f %10.2f %8ld\n", r.op.c_str(),
                  r.bytes, r.elements, r.seconds * 1e6, r.algbw, r.busbw, r.wrong);
    s += line;
  }
  std::snprintf(line, sizeof line,
                "(%d ranks; bus factor: all-reduce 2(n-1)/n, reduce-scatter "
                "and all-gather (n-1)/n, send/recv 1)\n",
                ranks);
  s += line;
  return s;
}

std::string FormatCommJson(const std::vector<CommResult>& results, int ranks) {
  std::string s;
  char line[300];
  for (const CommResult& r : results) {
    std::snprintf(line, sizeof line,
                  "{\"op\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"seconds\":%.9g,\"algbw_gb_s\":%.6g,"
                  "\"busbw_gb_s\":%.6g,\"wrong\":%ld}\n",
                  r.op.c_str(), ranks, r.bytes, r.seconds, r.algbw, r.busbw, r.wrong);
    s += line;
  }
  return s;
}

}  // namespace loom::gpu_check
