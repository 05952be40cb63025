// The named GPT-2 model sizes a job spec may ask for (`spec.model.preset`), as listed in
// docs/rank-contract.md. Immutable data; thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace loom::jobs {

// The five dimensions of a GPT model.
struct ModelDims {
  int layers = 0;   // L: transformer blocks
  int hidden = 0;   // C: channels
  int heads = 0;    // NH: attention heads; divides hidden
  int seq_len = 0;  // T: maximum sequence length (position table size)
  int vocab = 0;    // V: vocabulary size
};

struct ModelPreset {
  std::string_view name;
  ModelDims dims;
};

// Every preset, smallest first: tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b.
std::span<const ModelPreset> ModelPresets();

// The preset called `name` (exact, case-sensitive), or nullopt.
std::optional<ModelDims> FindModelPreset(std::string_view name);

// "tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b", for error messages.
std::string ModelPresetNames();

}  // namespace loom::jobs
