// Memory of one rank of Loom's GPU backend (worker/train: GptCuda in bf16 mixed precision on
// one CUDA device, any data x tensor x pipeline layout but ZeRO-1), by component, in the terms
// of MemoryBreakdown. Below, the whole model's terms; a tensor or pipeline shard holds its
// stage's blocks (the embeddings on the first stage, the final layernorm and the head on the
// last) with 1/tp of each sliced width, one set of activations per micro-batch in flight, and
// the trainer's (B, T, C) bf16 stage buffers.
//
// Why a variant: the planner's GPU formula (memory_model.h, Korthikanti et al. 2022) counts what
// a Megatron-style block saves for backward (dropout masks, pre-softmax scores, fp32 softmax),
// adds a 10% fragmentation margin and two 25 MiB buckets. GptCuda keeps a different, smaller set
// of buffers: the formula predicts 27.3 GiB for gpt2-124m at b = 16, s = 1024, where GptCuda's
// buffers come to 14.4 GiB (15.4 GiB with the runtime reserve: 1.8x). This file states GptCuda's
// own layout, so that the planner's figure is what the worker's StepResult::peak_memory_bytes
// reports (the caching allocator's peak allocated bytes plus the cuBLASLt workspace).
//
// Every device buffer but the cuBLASLt workspace comes from one CachingAllocator, all of them
// before the first step (GptCuda's constructor, the gradient buckets, GptCuda::Reserve); a
// step allocates nothing, so the peak is the sum of the blocks handed out. With L blocks,
// C channels, NH heads, V the vocabulary, Vp = round_up(V, 64) (GptCuda::kVocabMultiple),
// maxT rows of the position table (the planner's s), T = s, B = b, N = B·T tokens,
// P = TotalParams and n = P + (Vp − V)·C parameters on the device (wte's padding rows), the
// requests in bytes, in GptCuda's order:
//  - weights: params, bf16, 2·n.
//  - gradients: grads, bf16, 2·n.
//  - optimizer: the fp32 master weights, AdamW m and v, 3 × 4·n.
//  - workspace (constructor): the gradient norm's 1024 fp32 partials and its one fp32 result.
//  - comm_buffers, dp > 1 only (cuda_grad_sync.h, built before Reserve): one bf16 buffer per
//    gradient bucket, the pieces of PlanGradBuckets (lnf, then blocks L−1..0 in backward's
//    order, then wpe and wte) packed greedily into buckets of at most 25 MiB (the default
//    --dp-bucket-mb), the wte bucket grown by wte's padding: 2·n in all; one fp32 for the loss's
//    sum. Then, every layout, the backend's 16 fp32 staging values for collectives on host
//    values (workspace).
//  - activations (Reserve), stacked over the L blocks, bf16 unless fp32 is said: ln1, atty,
//    residual2, ln2, residual3 (1 width C each), qkv (3C), fch and fch_gelu (4C each): 16
//    values of width C per token; ln1 and ln2 mean and rstd (4 fp32 per token); and the
//    attention's own: with the fused kernels (head size C/NH a multiple of 16 up to 64, as
//    GPT-2's 64: CudaFlashAttention) the fp32 log-sum-exp per query and head, (B, NH, T), so
//    L·(2·N·16·C + 16·N + 4·B·NH·T), linear in T; otherwise the probabilities att (B, NH, T, T):
//    L·(2·N·16·C + 16·N + 2·B·NH·T²), i.e. per block s·b·h·(32 + 2·a·s/h) + 16·s·b against
//    Korthikanti's s·b·h·(34 + 5·a·s/h).
//  - embedding_and_logits (Reserve): encoded, proj and lnf (bf16, width C each), lnf mean and
//    rstd, the log-sum-exp, losses and dlosses (fp32, 1 per token each), tokens and targets
//    (int32), logits and dlogits (bf16, width Vp each): 6·N·C + 28·N + 4·N·Vp.
//  - workspace (Reserve): the backward scratch reused by every block, dresidual, dln, datty
//    (width C), dqkv (3C), dfch_gelu and dfch (4C): 2·14·N·C; layernorm backward's fp32 column
//    partials, 4·2·ceil(N/64)·C (LayerNormBackwardScratchFloats); the attention scratch: fused,
//    one fp32 per query and head, round_up(4·B·NH·T, 256) (FlashAttentionScratchBytes);
//    unfused, per batch element, round_up(4·NH·T², 256) + 2·NH·T² (AttentionScratchBytes); and,
//    outside the allocator, the GemmContext's cuBLASLt workspace of 32 MiB.
// The allocator's rounding is exact as well (caching_allocator.h): each request is rounded up to
// 512 B; requests up to 1 MiB come from 2 MiB segments, larger ones from segments of
// max(size, 20 MiB); a request takes the smallest free block that fits, and the block is split
// when the rest is at least 512 B (small) or more than 1 MiB (large), otherwise the whole block
// is handed out and counted as allocated. Each component above is the sum of its requests'
// blocks, so allocated() is the allocator's peak allocated bytes plus the GEMM workspace.
//  - fragmentation: the allocator's reserved bytes minus its allocated bytes at the peak: the
//    free tails of the segments (e.g. the rest of a 20 MiB segment opened for a 1.5 MiB
//    request), exact as well, so allocated() + fragmentation is what StepResult reports as
//    reserved_memory_bytes.
//  - runtime_reserve: 1 GiB for what no allocator sees (the CUDA context, cuBLAS's own
//    workspaces, NCCL's channel buffers), as memory_model.h; an estimate, not measured here.
// Micro-batches of gradient accumulation reuse the same buffers: one is in flight whatever
// their number. GptCuda's position table has max_seq_len rows; the planner's s is both T and
// that, as everywhere in the planner.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/planner/layout.h"
#include "server/planner/memory_model.h"
#include "server/planner/model_shape.h"

namespace loom::planner {

// The GPU backend's constants this model mirrors (kernels/cuda/launch.h, gpt_cuda.h,
// caching_allocator.h, grad_buckets.h); tests/planner checks the allocator's against the real one.
inline constexpr int64_t kCudaVocabMultiple = 64;                      // GptCuda::kVocabMultiple
inline constexpr int64_t kCudaGemmWorkspaceBytes = int64_t{32} << 20;  // kMatmulWorkspaceBytes
inline constexpr int64_t kCudaGradNormBlocks = 1024;                   // launch::kGradNormBlocks
inline constexpr int64_t kCudaHostScalars = 16;                        // CudaBackend::
inline constexpr int64_t kCudaColumnSumRows = 64;                      // launch::kColumnSumRows
inline constexpr int64_t kCudaDpBucketBytes = int64_t{25} << 20;       // kDefaultBucketBytes
inline constexpr int64_t kCudaStagingFloats = int64_t{1} << 18;        // GptCuda::kStagingFloats
inline constexpr int64_t kCudaZeroPiece = int64_t{1} << 20;            // CudaZero::kDefaultPiece
inline constexpr int64_t kCudaAllocRoundBytes = 512;                   // CachingAllocator::
inline constexpr int64_t kCudaSmallRequestLimit = int64_t{1} << 20;
inline constexpr int64_t kCudaSmallSegmentBytes = int64_t{2} << 20;
inline constexpr int64_t kCudaLargeSegmentBytes = int64_t{20} << 20;
inline constexpr int64_t kCudaFlashMaxHeadSize = 64;  // launch::kFlashMaxHeadSize

// True when GptCuda runs the fused attention kernels for heads of C / NH channels
// (launch::FlashAttentionSupported): a multiple of 16 up to kCudaFlashMaxHeadSize.
constexpr bool CudaFlashAttention(int64_t C, int64_t NH) {
  if (NH <= 0 || C % NH != 0) return false;
  const int64_t hs = C / NH;
  return hs > 0 && hs % 16 == 0 && hs <= kCudaFlashMaxHeadSize;
}

// One device allocation of the GPU backend, in the order the worker makes it.
struct CudaBufferRequest {
  std::string name;                              // GptCuda's buffer, e.g. "qkv" or "bucket 3"
  int64_t bytes = 0;                             // what is asked of the allocator
  double MemoryBreakdown::*component = nullptr;  // where its block is counted
};

// The allocations of one GPU-backend rank for `m` under `layout`, on pipeline stage `stage`
// holding `blocks` blocks (-1: the even split's share) and its 1/tp tensor slices: the
// constructor's, the gradient buckets' when dp > 1, the backend's host-value staging buffer,
// Reserve's (one set of activations per micro-batch the stage keeps in flight), then the
// trainer's pipeline stage buffers when pp > 1. Pure.
std::vector<CudaBufferRequest> CudaBackendRequests(const ModelShape& m, const Layout& layout,
                                                   int stage = 0, int blocks = -1);

// The caching allocator after serving `request_bytes` in order with nothing freed: the block
// each request got (its rounded size, or the whole block when the rest was not split off), and
// the segment bytes held. Mirrors caching_allocator.cc.
struct CachingAllocatorState {
  std::vector<int64_t> block_bytes;  // per request
  int64_t allocated = 0;             // sum of block_bytes
  int64_t reserved = 0;              // sum of the segments
};
CachingAllocatorState SimulateCachingAllocator(const std::vector<int64_t>& request_bytes);

// The memory of one rank of the GPU backend for `m` under `layout`, on stage `stage` with
// `blocks` blocks (-1: the even split's). INVALID_ARGUMENT naming the option when the GPU
// backend does not run it (fp32, recompute, ZeRO-1) or the stage does not exist. Exact (byte
// for byte against the allocator) for one rank of the whole model; for tensor and pipeline
// shards the same request list, which the GPU check has not measured on a device yet. Pure.
absl::StatusOr<MemoryBreakdown> CudaBackendMemory(const ModelShape& m, Precision precision,
                                                  const Layout& layout, int stage = 0,
                                                  int blocks = -1);

}  // namespace loom::planner
