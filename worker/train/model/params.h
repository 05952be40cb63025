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

// One tensor's place in the buffer.
struct TensorInfo {
  std::string name;            // "wte", "qkvw", ...
  std::vector<int64_t> shape;  // e.g. {L, 3C, C}
  size_t offset = 0;           // in floats from the start of the buffer
  size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (matrices only: not biases or LN)
};

// The 16 tensors in llm.c's order, with offsets packed back to back:
//   wte (V, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C),
//   attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C),
//   fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C).
std::vector<TensorInfo> ParamTable(const ModelDims& dims);

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
void InitParams(float* base, const std::vector<TensorInfo>& table, int layers, uint64_t seed);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_PARAMS_H_
