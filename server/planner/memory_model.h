// Memory per device of one pipeline stage, by component. The terms and their sources:
//  - parameters, gradients, optimizer state: mixed-precision Adam as in Rajbhandari et al. 2020
//    (ZeRO, §3.1): bf16 weights (2 B) and gradients (2 B), fp32 master weights and two Adam
//    moments (12 B); fp32 training keeps 4 + 4 B and two fp32 moments (8 B). Tensor and
//    pipeline parallelism divide the parameters (Megatron split, model_shape.h); ZeRO-1 also
//    divides the optimizer state by dp.
//  - activations per block per micro-batch: Korthikanti et al. 2022, "Reducing Activation
//    Recomputation in Large Transformer Models", §4: s·b·h·(34 + 5·a·s/h) bytes in 16-bit; with
//    tensor parallelism (no sequence parallelism, as Loom's runtime) s·b·h·(10 + 24/t +
//    5·a·s/(h·t)); selective recompute drops the attention-core term (5·a·s/(h·t)); full
//    recompute keeps only the block input, 2·s·b·h. fp32 doubles every element.
//  - micro-batches in flight: min(pp − stage, m) under 1F1B, m under GPipe (layout.h).
//  - first stage: the token ids of the micro-batches in flight; last stage: targets, the final
//    layernorm's saved input and output, the saved logits (s·b·V/t per micro-batch in flight)
//    and one fp32 softmax/gradient buffer for the micro-batch in the loss.
//  - communication buffers: two data-parallel gradient buckets of 25 MiB (one reducing, one
//    filling) when dp > 1; a receive buffer for the activation and one for its gradient
//    (s·b·h each) when pp > 1. Tensor all-reduces run in place.
//  - workspace: one block's full activations for one micro-batch, live while a block's backward
//    runs (its recomputed activations, or the gradients of its activations).
//  - fragmentation margin: 10% of the allocator's bytes (caching allocators typically lose
//    5-15% to blocks that cannot be reused for another size).
//  - runtime reserve outside the allocator: 1 GiB per GPU for the CUDA context, cuBLAS
//    workspaces and NCCL channel buffers; 0 on CPU devices.
// The CPU backend keeps other buffers than a GPU block (fp32 probabilities of size B·T·V, no
// dropout masks or pre-softmax scores): cpu_backend_memory.h states its exact layout, which
// matches its measured peak; this GPU formula is off by -14%..+15% there, so the search
// (layout_evaluator.h) uses the CPU backend's layout for CPU devices. Loom's own GPU backend
// keeps fewer buffers than a Megatron block too (about 0.55x of this formula for gpt2-124m), so
// the layouts it runs use its exact layout (cuda_backend_memory.h); this formula stays for the
// tensor- and pipeline-parallel layouts it does not run yet.
#pragma once

#include <vector>

#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/model_shape.h"

namespace loom::planner {

inline constexpr double kDpBucketBytes = 25.0 * kMiB;
inline constexpr int kDpBucketsInFlight = 2;
inline constexpr double kFragmentationFraction = 0.10;
inline constexpr double kGpuRuntimeReserveBytes = 1.0 * kGiB;

struct MemoryBreakdown {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;           // saved by the blocks of this stage, all micro-batches
  double embedding_and_logits = 0;  // first/last stage buffers (not the parameters)
  double comm_buffers = 0;
  double workspace = 0;
  double fragmentation = 0;  // kFragmentationFraction × the sum above
  double runtime_reserve = 0;

  double allocated() const {
    return weights + gradients + optimizer + activations + embedding_and_logits + comm_buffers +
           workspace;
  }
  double total() const { return allocated() + fragmentation + runtime_reserve; }
};

// Bytes per parameter held on a device, split the way MemoryBreakdown reports them.
struct BytesPerParam {
  double weights, gradients, optimizer;
  double total() const { return weights + gradients + optimizer; }
};
BytesPerParam ParamBytes(Precision precision, const Layout& layout);

// Activation bytes one block saves for one micro-batch under the layout's tp and recompute.
// gpt2-124m, b = 1, no recompute, bf16: 1024·1·768·(34 + 5·12·1024/768) = 89,653,248.
double BlockActivationBytes(const ModelShape& m, Precision precision, const Layout& layout);

// Parameters of stage `stage` outside its blocks: the embedding on the first, the final
// layernorm (and head copy when pp > 1) on the last.
double StageExtraParams(const ModelShape& m, const Layout& layout, int stage);

// Memory of one device of stage `stage` holding `num_blocks` blocks.
MemoryBreakdown StageMemory(const ModelShape& m, Precision precision, const Layout& layout,
                            const DeviceSpec& devices, int stage, int num_blocks);

// The part of StageMemory that does not grow with the blocks (embedding/head parameters and
// buffers, communication buffers, workspace), before the fragmentation margin.
double StageFixedBytes(const ModelShape& m, Precision precision, const Layout& layout, int stage);

// Bytes the allocator may hand out on one device so that, with the fragmentation margin and the
// runtime reserve, the device's memory is not exceeded.
double AllocatableBytes(const DeviceSpec& devices);
double RuntimeReserveBytes(const DeviceSpec& devices);

}  // namespace loom::planner
