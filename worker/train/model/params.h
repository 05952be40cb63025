// The parameters of a GPT-2 model: one contiguous fp32 buffer, cut into named tensors in llm.c's
// order. The name table is the contract with checkpoints (safetensors names) and llm.c's model
// file (tensor order); never reorder it.
#ifndef LOOM_WORKER_TRAIN_MODEL_PARAMS_H_
#define LOOM_WORKER_TRAIN_MODEL_PARAMS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/train/model/dims.h"

namespace loom::train {

inline constexpr int kNumParamTensors = 16;

// What part of the whole model one rank holds (DESIGN.md, "TP" and "PP").
//   - Pipeline: blocks [first_block, last_block) of the L blocks. The stage with first_block == 0
//     also holds the embeddings (wte, wpe); the stage with last_block == L holds the final
//     layernorm and the head, whose weight is wte (tied): with pp > 1 wte is held by both the
//     first and the last stage, and their gradients are summed between them.
//   - Tensor (Megatron): heads and the MLP width are split across tp ranks. Column-parallel
//     qkvw/qkvb (rows of heads [tp_rank*NH/tp, (tp_rank+1)*NH/tp) of each of q, k and v) and
//     fcw/fcb (rows [tp_rank*4C/tp, ...)); row-parallel attprojw (columns of the same heads) and
//     fcprojw (columns of the same MLP slice); everything else is replicated on every tp rank.
// The default is the whole model on one rank.
struct ModelShard {
  int tp_size = 1;
  int tp_rank = 0;
  int first_block = 0;
  int last_block = -1;  // -1: through the last block (dims.layers)
};

// Why `shard` cannot hold a part of a model of `dims` ("tensor parallel 3 does not divide the
// 4 heads (model.heads); use a tensor size that divides it"), or "" when it can. Requires valid
// dims.
std::string ShardProblem(const ModelDims& dims, const ModelShard& shard);

// One tensor's place in the buffer, and which slice of the whole model's tensor it is.
//
// The slice is a box in the tensor's "view": the whole tensor reshaped so that the slice is
// contiguous per dimension. view_shape equals global_shape except for qkvw (L, 3C, C), viewed
// as (L, 3, C, C), and qkvb (L, 3C), viewed as (L, 3, C), so that a head range of q, k and v is
// one box. The local tensor holds the box's elements in row-major order of the view (so local
// numel = product of box_size), which is also the local `shape` read row-major.
struct TensorInfo {
  std::string name;            // "wte", "qkvw", ...
  std::vector<int64_t> shape;  // local shape, e.g. {L_stage, 3C/tp, C}; numel 0 when not held
  size_t offset = 0;           // in floats from the start of the buffer
  size_t numel = 0;            // 0 when this rank does not hold the tensor (e.g. wpe off stage 0)
  bool decay = false;          // AdamW weight decay applies (matrices only: not biases or LN)
  std::vector<int64_t> global_shape;  // the whole model's tensor, as checkpoints store it
  std::vector<int64_t> view_shape;    // global_shape, or the split view of qkvw / qkvb
  std::vector<int64_t> box_start;     // per view dimension
  std::vector<int64_t> box_size;      // per view dimension
  bool stacked = false;   // the leading dimension is the layer (box_start[0] = first_block)
  bool tp_split = false;  // different values on each tp rank (else replicated over tp)
  // This copy counts in model-wide sums (gradient norm) and is the one saved: false for the tp
  // replicas on tp_rank > 0, and for the last stage's copy of wte when pp > 1. (Data-parallel
  // replicas are the trainer's business.)
  bool owner = true;
};

// The 16 tensors in llm.c's order, with offsets packed back to back:
//   wte (V, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C),
//   attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C),
//   fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C).
std::vector<TensorInfo> ParamTable(const ModelDims& dims);

// The same 16 entries, in the same order, for the part `shard` holds: the tensors it does not
// hold have numel 0 (and shape with a 0), offsets packed over the held ones. Requires
// ShardProblem(dims, shard) empty. ParamTable(dims) == ShardTable(dims, ModelShard{}).
std::vector<TensorInfo> ShardTable(const ModelDims& dims, const ModelShard& shard);

// The world's gradient norm is summed in parts, one per block and two more, so that its value
// does not depend on how the blocks are split into stages (Backend::OwnedGradSumSquares,
// backend.h).
inline int GradNormParts(int layers) { return layers + 2; }
// Block l's tensors: part l; wte and wpe: part `layers`; lnfw and lnfb: part layers + 1.
inline int GradNormPart(int layers, const std::string& tensor, int block) {
  if (tensor == "wte" || tensor == "wpe") return layers;
  if (tensor == "lnfw" || tensor == "lnfb") return layers + 1;
  return block;
}

// Total floats in the table.
size_t ParamCount(const std::vector<TensorInfo>& table);

// Typed views into a parameter-shaped buffer (parameters, gradients, or optimizer moments).
struct ParamTensors {
  float* wte;       // (V, C)
  float* wpe;       // (maxT, C)
  float* ln1w;      // (L, C)
  float* ln1b;      // (L, C)
  float* qkvw;      // (L, 3C, C)
  float* qkvb;      // (L, 3C)
  float* attprojw;  // (L, C, C)
  float* attprojb;  // (L, C)
  float* ln2w;      // (L, C)
  float* ln2b;      // (L, C)
  float* fcw;       // (L, 4C, C)
  float* fcb;       // (L, 4C)
  float* fcprojw;   // (L, C, 4C)
  float* fcprojb;   // (L, C)
  float* lnfw;      // (C)
  float* lnfb;      // (C)
};

// Points each field of ParamTensors at its tensor in `base` (laid out by `table`).
ParamTensors ViewParams(float* base, const std::vector<TensorInfo>& table);

// GPT-2 initialisation, deterministic in `seed`: weights normal(0, 0.02), the residual
// projections (attprojw, fcprojw) normal(0, 0.02 / sqrt(2L)), biases 0, layernorm weights 1.
// Each tensor draws from its own stream seeded by (seed, tensor index), so one tensor's values
// do not depend on the others' sizes.
// With a shard table, each held tensor gets its box of the whole model's values: a sharded model
// starts from exactly the single-rank model's weights.
void InitParams(float* base, const std::vector<TensorInfo>& table, int layers, uint64_t seed);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_PARAMS_H_
