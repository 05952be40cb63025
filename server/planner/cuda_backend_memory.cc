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

// What one rank of a layout holds: stage `stage` of pp, with `blocks` blocks, its 1/tp slices.
struct Shard {
  bool first = true, last = true;
  int64_t blocks = 0;               // Lb
  int64_t cl = 0, nhl = 0, fl = 0;  // C/tp, NH/tp, 4C/tp
};

// The sizes of the gradient buckets in bf16 elements, on the padded device layout:
// PlanGradBuckets (grad_buckets.cc) over the shard's table, then ToPaddedLayout, which grows the
// bucket holding wte by the padding rows.
std::vector<int64_t> BucketElements(const ModelShape& m, const Shard& sh, int64_t pad) {
  const int64_t C = m.hidden, Cl = sh.cl, Fl = sh.fl;
  std::vector<int64_t> pieces;
  size_t wte_piece = 0;
  if (sh.last) pieces.insert(pieces.end(), {C, C});  // lnfb, lnfw (stage L)
  if (sh.last && !sh.first) {                        // the head's copy of wte, final at stage L
    wte_piece = pieces.size();
    pieces.push_back(int64_t{m.vocab} * C);
  }
  // Per block, from the last down, the order its backward writes them: fcprojb, fcprojw, fcb,
  // fcw, ln2b, ln2w, attprojb, attprojw, qkvb, qkvw, ln1b, ln1w (this rank's slices).
  const std::vector<int64_t> block = {C, C * Fl, Fl,     Fl * C,     C, C,
                                      C, C * Cl, 3 * Cl, 3 * Cl * C, C, C};
  for (int64_t l = 0; l < sh.blocks; ++l) pieces.insert(pieces.end(), block.begin(), block.end());
  if (sh.first) {
    pieces.push_back(int64_t{m.seq_len} * C);  // wpe
    wte_piece = pieces.size();
    pieces.push_back(int64_t{m.vocab} * C);  // wte, the last piece
  }
  const int64_t cap = kCudaDpBucketBytes / 2;
  std::vector<int64_t> buckets;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t p = pieces[i];
    if (buckets.empty() || (buckets.back() > 0 && buckets.back() + p > cap)) buckets.push_back(0);
    buckets.back() += p;
    if ((sh.first || sh.last) && i == wte_piece) buckets.back() += pad;  // wte's padding rows
  }
  return buckets;
}

// The shard of stage `stage` with `blocks` blocks (-1: the even split's) under `layout`.
Shard ShardOf(const ModelShape& m, const Layout& layout, int stage, int blocks) {
  Shard sh;
  sh.first = stage == 0;
  sh.last = stage == layout.pp - 1;
  sh.blocks = blocks >= 0 ? blocks : m.layers / layout.pp + (stage < m.layers % layout.pp);
  sh.cl = m.hidden / layout.tp;
  sh.nhl = m.heads / layout.tp;
  sh.fl = 4 * int64_t{m.hidden} / layout.tp;
  return sh;
}

// The requests of CudaBackendRequests, with their names only when `named` (the planner's search
// evaluates thousands of layouts and needs the sizes alone; building the names was most of its
// time).
std::vector<CudaBufferRequest> Requests(const ModelShape& m, const Layout& layout, int stage,
                                        int blocks, bool named) {
  const Shard sh = ShardOf(m, layout, stage, blocks);
  const int64_t L = sh.blocks, C = m.hidden, NH = sh.nhl, V = m.vocab, T = m.seq_len;
  const int64_t Cl = sh.cl, Fl = sh.fl;
  const int64_t B = layout.micro_batch, N = B * T;
  const bool flash = CudaFlashAttention(Cl, NH);  // GptCuda's choice, per its local heads
  const bool wte = sh.first || sh.last;
  const int64_t Vp = wte ? RoundUp(V, kCudaVocabMultiple) : 0;
  const int64_t pad = wte ? (Vp - V) * C : 0;
  // The shard table's parameters (ShardTable, params.cc), plus wte's padding rows.
  const int64_t per_block =
      2 * C + 3 * Cl * C + 3 * Cl + C * Cl + C + 2 * C + Fl * C + Fl + C * Fl + C;
  const int64_t n = L * per_block + (wte ? int64_t{V} * C + pad : 0) +
                    (sh.first ? int64_t{m.seq_len} * C : 0) + (sh.last ? 2 * C : 0);
  constexpr int64_t kBf16 = 2, kF32 = 4, kI32 = 4;
  constexpr int64_t kNumTensors = 16;  // the parameter table's (params.h)
  using MB = MemoryBreakdown;

  const int slots = MicroBatchesInFlight(layout, stage);
  std::vector<CudaBufferRequest> r;
  // About 24 requests per activation slot, 4 stage buffers per slot, and the fixed ones.
  r.reserve(static_cast<size_t>(slots) * 28 + 96);
  // add(name, bytes, component); `slot` > 0 appends " (slot N)", `index` >= 0 " N".
  auto add = [&r, named](const char* name, int64_t bytes, double MB::*component, int slot = 0,
                         int index = -1) {
    std::string full;
    if (named) {
      full = name;
      if (slot > 0) absl::StrAppend(&full, " (slot ", slot, ")");
      if (index >= 0) absl::StrAppend(&full, " ", index);
    }
    r.push_back({std::move(full), bytes, component});
  };
  // GptCuda's constructor.
  add("params", n * kBf16, &MB::weights);
  add("grads", n * kBf16, &MB::gradients);
  // The masters and moments of the master range (the table's layout, no padding rows): under
  // ZeRO-1 dp rank 0's range, the largest (cuda_zero.h: ZeroRangeOf over the table), else all.
  const bool zero = layout.zero1 && layout.dp > 1;
  const int64_t table = n - pad;
  const int64_t shard = zero ? CeilDiv(table, layout.dp) : table;
  const int64_t held = std::max<int64_t>(std::min(shard, table), 1);
  add("master", held * kF32, &MB::optimizer);
  add("adam m", held * kF32, &MB::optimizer);
  add("adam v", held * kF32, &MB::optimizer);
  add("norm partials", kCudaGradNormBlocks * kF32, &MB::workspace);
  add("norm out", kNumTensors * kF32, &MB::workspace);  // one sum of squares per tensor
  if (zero) {
    // GptCuda's upload staging (a range short of the table), then CudaZero's collective staging
    // ((dp + 1) pieces of fp32), constructed by the backend before anything else.
    add("upload staging", kCudaStagingFloats * kF32, &MB::workspace);
    add("zero staging", (layout.dp + 1) * std::min(kCudaZeroPiece, shard) * kF32,
        &MB::comm_buffers);
  } else if (layout.dp > 1) {
    // CudaGradSync, constructed by the CUDA backend (worker/train/cuda_backend.cc) before the
    // trainer calls Reserve.
    const std::vector<int64_t> buckets = BucketElements(m, sh, pad);
    for (size_t i = 0; i < buckets.size(); ++i) {
      add("bucket", buckets[i] * kBf16, &MB::comm_buffers, 0, static_cast<int>(i));
    }
    add("loss sum", kF32, &MB::comm_buffers);
  }
  // The backend's staging buffer for the step loop's collectives on host values
  // (CudaBackend::kHostScalars floats).
  add("host scalars", kCudaHostScalars * kF32, &MB::workspace);
  // GptCuda::Reserve(B, T, slots): the slots a stage keeps (MicroBatchesInFlight), slot 0's
  // buffers first, then the others', then the backward scratch.
  for (int slot = 0; slot < slots; ++slot) {
    add("encoded", N * C * kBf16, &MB::embedding_and_logits, slot);
    add("ln1", L * N * C * kBf16, &MB::activations, slot);
    add("ln1 mean", L * N * kF32, &MB::activations, slot);
    add("ln1 rstd", L * N * kF32, &MB::activations, slot);
    add("qkv", L * N * 3 * Cl * kBf16, &MB::activations, slot);
    add("atty", L * N * Cl * kBf16, &MB::activations, slot);
    if (flash) {
      add("att lse", L * B * NH * T * kF32, &MB::activations, slot);
    } else {
      add("att", L * B * NH * T * T * kBf16, &MB::activations, slot);
    }
    add("residual2", L * N * C * kBf16, &MB::activations, slot);
    add("ln2", L * N * C * kBf16, &MB::activations, slot);
    add("ln2 mean", L * N * kF32, &MB::activations, slot);
    add("ln2 rstd", L * N * kF32, &MB::activations, slot);
    add("fch", L * N * Fl * kBf16, &MB::activations, slot);
    add("fch gelu", L * N * Fl * kBf16, &MB::activations, slot);
    add("residual3", L * N * C * kBf16, &MB::activations, slot);
    if (slot == 0) add("proj", N * C * kBf16, &MB::embedding_and_logits);
    if (sh.last) {
      add("lnf", N * C * kBf16, &MB::embedding_and_logits, slot);
      add("lnf mean", N * kF32, &MB::embedding_and_logits, slot);
      add("lnf rstd", N * kF32, &MB::embedding_and_logits, slot);
      add("logits", N * Vp * kBf16, &MB::embedding_and_logits, slot);
      add("lse", N * kF32, &MB::embedding_and_logits, slot);
      add("losses", N * kF32, &MB::embedding_and_logits, slot);
    }
    if (sh.first) add("tokens", N * kI32, &MB::embedding_and_logits, slot);
    if (sh.last) add("targets", N * kI32, &MB::embedding_and_logits, slot);
  }
  if (sh.last) {
    add("dlosses", N * kF32, &MB::embedding_and_logits);
    add("dlogits", N * Vp * kBf16, &MB::embedding_and_logits);
  }
  add("dresidual", N * C * kBf16, &MB::workspace);
  add("dln", N * C * kBf16, &MB::workspace);
  add("datty", N * Cl * kBf16, &MB::workspace);
  add("dqkv", N * 3 * Cl * kBf16, &MB::workspace);
  add("dfch gelu", N * Fl * kBf16, &MB::workspace);
  add("dfch", N * Fl * kBf16, &MB::workspace);
  add("layernorm scratch", 2 * CeilDiv(N, kCudaColumnSumRows) * C * kF32, &MB::workspace);
  // Fused: one fp32 per query and head. Unfused: the fp32 scores of one batch element, then
  // (256-byte aligned) their bf16 gradient.
  add("attention scratch",
      flash ? RoundUp(B * NH * T * kF32, 256)
            : RoundUp(NH * T * T * kF32, 256) + NH * T * T * kBf16,
      &MB::workspace);
  // The trainer's pipeline stage buffers (B, T, C) bf16, one per slot and direction it uses
  // (trainer.cc): received activations and sent gradients on every stage but the first, received
  // gradients and sent activations on every stage but the last.
  if (layout.pp > 1) {
    const int64_t buffers = int64_t{slots} * ((sh.first ? 0 : 2) + (sh.last ? 0 : 2));
    for (int64_t i = 0; i < buffers; ++i) {
      add("stage buffer", RoundUp(N * C, 2) * kBf16, &MB::comm_buffers, 0, static_cast<int>(i));
    }
  }
  return r;
}

}  // namespace

std::vector<CudaBufferRequest> CudaBackendRequests(const ModelShape& m, const Layout& layout,
                                                   int stage, int blocks) {
  return Requests(m, layout, stage, blocks, /*named=*/true);
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
                                                  const Layout& layout, int stage, int blocks) {
  if (precision != Precision::kBf16) {
    return absl::InvalidArgumentError("precision: the GPU backend trains in bf16 only");
  }
  if (layout.recompute != Recompute::kNone) {
    return absl::InvalidArgumentError("layout: the GPU backend has no activation recompute");
  }
  if (layout.tp < 1 || layout.pp < 1 || m.heads % layout.tp != 0 || stage < 0 ||
      stage >= layout.pp || blocks == 0 || blocks > m.layers) {
    return absl::InvalidArgumentError("layout: no such stage or tensor slice of the model");
  }
  const std::vector<CudaBufferRequest> requests =
      Requests(m, layout, stage, blocks, /*named=*/false);
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
