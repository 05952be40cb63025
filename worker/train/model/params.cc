#include "worker/train/model/params.h"

#include <cmath>

#include "worker/train/error.h"
#include "worker/train/rng.h"

namespace loom::train {

std::vector<TensorInfo> ParamTable(const ModelDims& d) {
  const int64_t V = d.vocab, C = d.channels, L = d.layers, maxT = d.max_seq_len;
  std::vector<TensorInfo> table = {
      {"wte", {V, C}, 0, 0, true},
      {"wpe", {maxT, C}, 0, 0, true},
      {"ln1w", {L, C}, 0, 0, false},
      {"ln1b", {L, C}, 0, 0, false},
      {"qkvw", {L, 3 * C, C}, 0, 0, true},
      {"qkvb", {L, 3 * C}, 0, 0, false},
      {"attprojw", {L, C, C}, 0, 0, true},
      {"attprojb", {L, C}, 0, 0, false},
      {"ln2w", {L, C}, 0, 0, false},
      {"ln2b", {L, C}, 0, 0, false},
      {"fcw", {L, 4 * C, C}, 0, 0, true},
      {"fcb", {L, 4 * C}, 0, 0, false},
      {"fcprojw", {L, C, 4 * C}, 0, 0, true},
      {"fcprojb", {L, C}, 0, 0, false},
      {"lnfw", {C}, 0, 0, false},
      {"lnfb", {C}, 0, 0, false},
  };
  size_t offset = 0;
  for (TensorInfo& t : table) {
    t.numel = 1;
    for (int64_t s : t.shape) t.numel *= static_cast<size_t>(s);
    t.offset = offset;
    offset += t.numel;
  }
  return table;
}

size_t ParamCount(const std::vector<TensorInfo>& table) {
  return table.empty() ? 0 : table.back().offset + table.back().numel;
}

ParamTensors ViewParams(float* base, const std::vector<TensorInfo>& table) {
  LOOM_CHECK(table.size() == kNumParamTensors, "parameter table must have 16 tensors");
  float* p[kNumParamTensors];
  for (int i = 0; i < kNumParamTensors; ++i) p[i] = base + table[i].offset;
  return ParamTensors{p[0], p[1], p[2],  p[3],  p[4],  p[5],  p[6],  p[7],
                      p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]};
}

void InitParams(float* base, const std::vector<TensorInfo>& table, int layers, uint64_t seed) {
  const double kStd = 0.02;
  const double residual_std = kStd / std::sqrt(2.0 * layers);
  for (size_t i = 0; i < table.size(); ++i) {
    const TensorInfo& t = table[i];
    float* p = base + t.offset;
    const bool layernorm_weight = t.name == "ln1w" || t.name == "ln2w" || t.name == "lnfw";
    if (layernorm_weight) {
      for (size_t j = 0; j < t.numel; ++j) p[j] = 1.0f;
    } else if (!t.decay) {  // biases
      for (size_t j = 0; j < t.numel; ++j) p[j] = 0.0f;
    } else {
      const double std_dev = (t.name == "attprojw" || t.name == "fcprojw") ? residual_std : kStd;
      Rng rng(HashTuple(seed, 0x1a17, i));
      for (size_t j = 0; j < t.numel; ++j) p[j] = static_cast<float>(std_dev * rng.NextNormal());
    }
  }
}

}  // namespace loom::train
