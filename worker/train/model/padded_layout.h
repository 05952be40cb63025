// Where the GPU model keeps each parameter tensor (issue 5): its parameter-shaped device buffers
// (bf16 parameters and gradients, fp32 master weights and AdamW moments) hold the ParamTable's
// tensors in the table's order, except that wte has Vp = round_up(V, 64) rows instead of V
// (llm.c's padded vocabulary, so the head GEMM has aligned dimensions). Every other tensor sits
// at its table offset plus the (Vp - V) * C padding elements.
//
// Host-only and pure, so the mapping that checkpoints and initialisation depend on is tested on
// any machine: the GPU model (gpt_cuda) maps table ranges into this layout with it.
#ifndef LOOM_WORKER_TRAIN_MODEL_PADDED_LAYOUT_H_
#define LOOM_WORKER_TRAIN_MODEL_PADDED_LAYOUT_H_

#include <cstddef>
#include <functional>
#include <vector>

#include "worker/train/model/params.h"

namespace loom::train {

struct PaddedLayout {
  int padded_vocab = 0;         // Vp
  std::vector<size_t> offset;   // per table tensor: elements from the buffer's start
  std::vector<size_t> numel;    // per table tensor: elements (wte: Vp * C)
  size_t total = 0;             // the buffer's length: table total + (Vp - V) * C
};

// The padded layout of `table` (the whole model's ParamTable: wte (V, C) first, at offset 0),
// with the vocabulary rounded up to a multiple of `vocab_multiple` (>= 1). LOOM_CHECKs that the
// table has that shape.
PaddedLayout MakePaddedLayout(const std::vector<TensorInfo>& table, int vocab_multiple);

// Calls fn(tensor, device_offset, table_offset, n) for each piece of the table range [lo, hi),
// one per tensor it crosses, in table order: where those elements sit in a buffer of `layout`.
// The padding rows of wte are in no piece. (GptCuda uploads, updates and ZeRO-1's collectives
// move table ranges through it.)
void ForEachDeviceSpan(const PaddedLayout& layout, const std::vector<TensorInfo>& table, size_t lo,
                       size_t hi, const std::function<void(int, size_t, size_t, size_t)>& fn);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_PADDED_LAYOUT_H_
