// Memory of one rank of the CPU backend (worker/train: fp32 GPT-2 on the CPU kernels, data
// parallelism only), by component, in the terms of MemoryBreakdown.
//
// Why a variant: the planner's GPU formula (memory_model.h, Korthikanti et al. 2022) counts what
// a Megatron-style GPU block saves for backward (with dropout masks, pre-softmax scores, 16-bit
// logits and one fp32 softmax buffer). The CPU backend keeps a different set of buffers, so the
// GPU formula is off by -14% (tiny, b = 8) to +15% (small, b = 8) against the CPU backend's
// measured peak (tests/planner/cpu_memory_validation_test.cc). This file states the CPU
// backend's own layout (worker/train/model/gpt.h: Activations and BackwardScratch), so that
// predicted and measured memory agree for the jobs this machine can run.
//
// With P parameters (TotalParams), L blocks, s = T tokens per sequence, b = B sequences per
// micro-batch, h = C channels, a = NH heads, V the vocabulary, all in bytes:
//  - weights 4·P, gradients 4·P, optimizer 8·P (fp32 Adam m and v; no master copy).
//  - activations, per block, one micro-batch (gradient accumulation reuses them, so one is in
//    flight whatever the number of micro-batches): 4·(18·s·b·h + 4·s·b + a·b·s²), i.e. ln1,
//    qkv (3), atty, attproj, residual2, ln2, fch (4), fch_gelu (4), fcproj, residual3 = 18
//    values of width h per token; the two layernorms' mean and rstd = 4 per token; and the
//    attention probabilities (a·s² per sequence; the CPU kernel keeps no pre-softmax scores and
//    has no dropout).
//  - embedding_and_logits: 4·(2·s·b·h + 4·s·b + 3·s·b·V) + 16·s·b: the encoder output and the
//    final layernorm's output (2 widths h), its mean and rstd, the per-token losses and their
//    gradient (4 per token), the fp32 logits, softmax probabilities and logits gradient (3 of
//    width V); and the int32 token ids and targets twice (the trainer's batch and the model's
//    copy for backward).
//  - workspace: the backward scratch reused down the layers, 4·(14·s·b·h + a·b·s²): the
//    residual, layernorm and attention-output gradients (3 widths h), the qkv gradient (3), the
//    MLP gradients before and after GELU (4 + 4), and the attention's own scratch.
//  - comm_buffers: when dp > 1 the gradient buckets pack a copy of every gradient (4·P); the
//    training core's own memory meter does not count them.
//  - fragmentation and runtime_reserve: 0 (plain heap vectors allocated once, no device
//    runtime).
// The dataset's token stream is host data outside the model and is not counted.
#pragma once

#include "absl/status/statusor.h"
#include "server/planner/layout.h"
#include "server/planner/memory_model.h"
#include "server/planner/model_shape.h"

namespace loom::planner {

// The memory of one rank of the CPU backend for `m` under `layout`. INVALID_ARGUMENT naming the
// option when the layout or precision is one the CPU backend does not run (bf16, tp or pp > 1,
// recompute, ZeRO-1). Pure.
absl::StatusOr<MemoryBreakdown> CpuBackendMemory(const ModelShape& m, Precision precision,
                                                 const Layout& layout);

}  // namespace loom::planner
