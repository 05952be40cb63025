#include "worker/train/model/dims.h"

namespace loom::train {

std::optional<ModelDims> PresetDims(std::string_view name) {
  //                                  L    C   NH  maxT      V
  if (name == "tiny") return ModelDims{2, 64, 4, 64, 256};
  if (name == "small") return ModelDims{6, 384, 6, 256, 50257};
  if (name == "gpt2-124m") return ModelDims{12, 768, 12, 1024, 50257};
  if (name == "gpt2-350m") return ModelDims{24, 1024, 16, 1024, 50257};
  if (name == "gpt2-774m") return ModelDims{36, 1280, 20, 1024, 50257};
  if (name == "gpt2-1.5b") return ModelDims{48, 1600, 25, 1024, 50257};
  return std::nullopt;
}

const char* PresetNames() { return "tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b"; }

std::string DimsProblem(const ModelDims& d) {
  if (d.layers <= 0) return "model.layers: expected > 0, got " + std::to_string(d.layers);
  if (d.channels <= 0) return "model.hidden: expected > 0, got " + std::to_string(d.channels);
  if (d.heads <= 0) return "model.heads: expected > 0, got " + std::to_string(d.heads);
  if (d.max_seq_len <= 0) {
    return "model.seq_len: expected > 0, got " + std::to_string(d.max_seq_len);
  }
  if (d.vocab <= 0) return "model.vocab: expected > 0, got " + std::to_string(d.vocab);
  if (d.channels % d.heads != 0) {
    return "model.heads: " + std::to_string(d.heads) + " does not divide model.hidden " +
           std::to_string(d.channels);
  }
  if (d.vocab > 65536) {
    return "model.vocab: expected at most 65536 (token files hold uint16 ids), got " +
           std::to_string(d.vocab);
  }
  return "";
}

std::string DimsString(const ModelDims& d) {
  return "L=" + std::to_string(d.layers) + " C=" + std::to_string(d.channels) +
         " NH=" + std::to_string(d.heads) + " maxT=" + std::to_string(d.max_seq_len) +
         " V=" + std::to_string(d.vocab);
}

}  // namespace loom::train
