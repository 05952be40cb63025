// The dimensions of a GPT-2 model and the named presets of docs/rank-contract.md.
#ifndef LOOM_WORKER_TRAIN_MODEL_DIMS_H_
#define LOOM_WORKER_TRAIN_MODEL_DIMS_H_

#include <optional>
#include <string>
#include <string_view>

namespace loom::train {

struct ModelDims {
  int layers = 0;       // L
  int channels = 0;     // C
  int heads = 0;        // NH; HS = C / NH
  int max_seq_len = 0;  // maxT, rows of the position table
  int vocab = 0;        // V

  bool operator==(const ModelDims&) const = default;
};

// The dimensions of a named preset (tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b),
// or nullopt for an unknown name.
std::optional<ModelDims> PresetDims(std::string_view name);

// The preset names, comma-separated, for error messages.
const char* PresetNames();

// Checks that the dimensions make a model: all positive, heads dividing channels, vocab within
// what uint16 token files can address. Returns an empty string when valid, else the problem
// phrased with the spec's field names (e.g. "model.heads: 5 does not divide model.hidden 64").
std::string DimsProblem(const ModelDims& dims);

// "L=2 C=64 NH=4 maxT=64 V=256", for messages.
std::string DimsString(const ModelDims& dims);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_DIMS_H_
