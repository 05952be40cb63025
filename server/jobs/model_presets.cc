#include "server/jobs/model_presets.h"

#include <array>

namespace loom::jobs {
namespace {

// docs/rank-contract.md, "Model presets". Every entry has heads dividing hidden.
constexpr std::array<ModelPreset, 6> kPresets = {{
    {"tiny", {2, 64, 4, 64, 256}},
    {"small", {6, 384, 6, 256, 50257}},
    {"gpt2-124m", {12, 768, 12, 1024, 50257}},
    {"gpt2-350m", {24, 1024, 16, 1024, 50257}},
    {"gpt2-774m", {36, 1280, 20, 1024, 50257}},
    {"gpt2-1.5b", {48, 1600, 25, 1024, 50257}},
}};

}  // namespace

std::span<const ModelPreset> ModelPresets() { return kPresets; }

std::optional<ModelDims> FindModelPreset(std::string_view name) {
  for (const ModelPreset& preset : kPresets) {
    if (preset.name == name) return preset.dims;
  }
  return std::nullopt;
}

std::string ModelPresetNames() {
  std::string names;
  for (const ModelPreset& preset : kPresets) {
    if (!names.empty()) names += ", ";
    names += preset.name;
  }
  return names;
}

}  // namespace loom::jobs
