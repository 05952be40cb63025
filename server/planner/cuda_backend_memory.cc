#include "server/planner/cuda_backend_memory.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::planner {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// The sizes of the gradient buckets in bf16 elements, on the padded device layout:
// PlanGradBuckets (grad_buckets.cc) over the whole model's table, then ToPaddedLayout, which
// grows the bucket holding wte by the padding rows.
std::vector<int64_t> BucketElements(const ModelShape& m, int64_t pad) {
  const int64_t C = m.hidden;
  std::vector<int64_t> pieces = {C, C};  // lnfb, lnfw (stage L)
  // Per block, from L−1 down to 0, the order its backward writes them: fcprojb, fcprojw, fcb,
  // fcw, ln2b, ln2w, attprojb, attprojw, qkvb, qkvw, ln1b, ln1w.
  const std::vector<int64_t> block = {C, 4 * C * C, 4 * C, 4 * C * C, C, C,
                                      C, C * C,     3 * C, 3 * C * C, C, C};
  for (int l = 0; l < m.layers; ++l) pieces.insert(pieces.end(), block.begin(), block.end());
  pieces.push_back(int64_t{m.seq_len} * C);  // wpe
  pieces.push_back(int64_t{m.vocab} * C);    // wte, the last piece
  const int64_t cap = kCudaDpBucketBytes / 2;
  std::vector<int64_t> buckets;
  for (int64_t p : pieces) {
    if (buckets.empty() || (buckets.back() > 0 && buckets.back() + p > cap)) buckets.push_back(0);
    buckets.back() += p;
  }
  buckets.back() += pad;  // wte's bucket is the last one
  return buckets;
}

}  // namespace

std::vector<CudaBufferRequest> CudaBackendRequests(const ModelShape& m, const Layout& layout) {
  const int64_t L = m.layers, C = m.hidden, NH = m.heads, V = m.vocab, T = m.seq_len;
  const int64_t B = layout.micro_batch, N = B * T;
  const int64_t Vp = RoundUp(V, kCudaVocabMultiple);
  const int64_t pad = (Vp - V) * C;
  const int64_t n = int64_t(TotalParams(m)) + pad;
  constexpr int64_t kBf16 = 2, kF32 = 4, kI32 = 4;
  using MB = MemoryBreakdown;

  std::vector<CudaBufferRequest> r;
  auto add = [&r](std::string name, int64_t bytes, double MB::*component) {
    r.push_back({std::move(name), bytes, component});
  };
  // GptCuda's constructor.
  add("params", n * kBf16, &MB::weights);
  add("grads", n * kBf16, &MB::gradients);
  add("master", n * kF32, &MB::optimizer);
  add("adam m", n * kF32, &MB::optimizer);
  add("adam v", n * kF32, &MB::optimizer);
  add("norm partials", kCudaGradNormBlocks * kF32, &MB::workspace);
  add("norm out", kF32, &MB::workspace);
  // CudaGradSync, constructed by the CUDA backend (worker/train/cuda_backend.cc) before the
  // trainer calls Reserve.
  if (layout.dp > 1) {
    const std::vector<int64_t> buckets = BucketElements(m, pad);
    for (size_t i = 0; i < buckets.size(); ++i) {
      add(absl::StrCat("bucket ", i), buckets[i] * kBf16, &MB::comm_buffers);
    }
    add("loss sum", kF32, &MB::comm_buffers);
  }
  // The backend's staging buffer for the step loop's collectives on host values
  // (CudaBackend::kHostScalars floats).
  add("host scalars", kCudaHostScalars * kF32, &MB::workspace);
  // GptCuda::Reserve(B, T).
  add("encoded", N * C * kBf16, &MB::embedding_and_logits);
  add("ln1", L * N * C * kBf16, &MB::activations);
  add("ln1 mean", L * N * kF32, &MB::activations);
  add("ln1 rstd", L * N * kF32, &MB::activations);
  add("qkv", L * N * 3 * C * kBf16, &MB::activations);
  add("atty", L * N * C * kBf16, &MB::activations);
  add("att", L * B * NH * T * T * kBf16, &MB::activations);
  add("residual2", L * N * C * kBf16, &MB::activations);
  add("ln2", L * N * C * kBf16, &MB::activations);
  add("ln2 mean", L * N * kF32, &MB::activations);
  add("ln2 rstd", L * N * kF32, &MB::activations);
  add("fch", L * N * 4 * C * kBf16, &MB::activations);
  add("fch gelu", L * N * 4 * C * kBf16, &MB::activations);
  add("residual3", L * N * C * kBf16, &MB::activations);
  add("proj", N * C * kBf16, &MB::embedding_and_logits);
  add("lnf", N * C * kBf16, &MB::embedding_and_logits);
  add("lnf mean", N * kF32, &MB::embedding_and_logits);
  add("lnf rstd", N * kF32, &MB::embedding_and_logits);
  add("logits", N * Vp * kBf16, &MB::embedding_and_logits);
  add("lse", N * kF32, &MB::embedding_and_logits);
  add("losses", N * kF32, &MB::embedding_and_logits);
  add("tokens", N * kI32, &MB::embedding_and_logits);
  add("targets", N * kI32, &MB::embedding_and_logits);
  add("dlosses", N * kF32, &MB::embedding_and_logits);
  add("dlogits", N * Vp * kBf16, &MB::embedding_and_logits);
  add("dresidual", N * C * kBf16, &MB::workspace);
  add("dln", N * C * kBf16, &MB::workspace);
  add("datty", N * C * kBf16, &MB::workspace);
  add("dqkv", N * 3 * C * kBf16, &MB::workspace);
  add("dfch gelu", N * 4 * C * kBf16, &MB::workspace);
  add("dfch", N * 4 * C * kBf16, &MB::workspace);
  add("layernorm scratch", 2 * CeilDiv(N, kCudaColumnSumRows) * C * kF32, &MB::workspace);
  // fp32 scores of one batch element, then (256-byte aligned) their bf16 gradient.
  add("attention scratch", RoundUp(NH * T * T * kF32, 256) + NH * T * T * kBf16, &MB::workspace);
  return r;
}

CachingAllocatorState SimulateCachingAllocator(const std::vector<int64_t>& request_bytes) {
  // Nothing is freed before the peak, so no block merges and no stream waits: a pool is the
  // multiset of the free blocks' sizes (which of two equal blocks is taken changes no size).
  std::multiset<int64_t> small_free, large_free;
  CachingAllocatorState s;
  for (int64_t bytes : request_bytes) {
    if (bytes <= 0) {  // Allocate(0) returns nullptr and takes nothing
      s.block_bytes.push_back(0);
      continue;
    }
    const int64_t size = RoundUp(bytes, kCudaAllocRoundBytes);
    const bool small = size <= kCudaSmallRequestLimit;
    std::multiset<int64_t>& pool = small ? small_free : large_free;
    int64_t block = 0;
    auto it = pool.lower_bound(size);  // best fit: the smallest free block that fits
    if (it != pool.end()) {
      block = *it;
      pool.erase(it);
    } else {
      block = small ? kCudaSmallSegmentBytes : std::max(size, kCudaLargeSegmentBytes);
      s.reserved += block;
    }
    const int64_t rest = block - size;
    if (small ? rest >= kCudaAllocRoundBytes : rest > kCudaSmallRequestLimit) {
      pool.insert(rest);
      block = size;
    }
    s.block_bytes.push_back(block);
    s.allocated += block;
  }
  return s;
}

absl::StatusOr<MemoryBreakdown> CudaBackendMemory(const ModelShape& m, Precision precision,
                                                  const Layout& layout) {
  if (precision != Precision::kBf16) {
    return absl::InvalidArgumentError("precision: the GPU backend trains in bf16 only");
  }
  if (layout.tp != 1 || layout.pp != 1) {
    return absl::InvalidArgumentError(
        "layout: the GPU backend runs data parallelism only (tensor = pipeline = 1)");
  }
  if (layout.recompute != Recompute::kNone || layout.zero1) {
    return absl::InvalidArgumentError(
        "layout: the GPU backend has no activation recompute and no ZeRO-1");
  }
  const std::vector<CudaBufferRequest> requests = CudaBackendRequests(m, layout);
  std::vector<int64_t> bytes;
  bytes.reserve(requests.size());
  for (const CudaBufferRequest& q : requests) bytes.push_back(q.bytes);
  const CachingAllocatorState state = SimulateCachingAllocator(bytes);
  MemoryBreakdown r;
  for (size_t i = 0; i < requests.size(); ++i) {
    r.*(requests[i].component) += double(state.block_bytes[i]);
  }
  r.workspace += double(kCudaGemmWorkspaceBytes);  // cudaMalloc'd by the GemmContext
  r.fragmentation = double(state.reserved - state.allocated);
  r.runtime_reserve = kGpuRuntimeReserveBytes;
  return r;
}

}  // namespace loom::planner
