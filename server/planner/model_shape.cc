#include "server/planner/model_shape.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::planner {
namespace {

struct Preset {
  const char* name;
  int layers, hidden, heads, seq_len, vocab;
};

// The first six rows are docs/rank-contract.md verbatim; the rest are planning-only shapes.
constexpr std::array<Preset, 11> kPresets = {{
    {"tiny", 2, 64, 4, 64, 256},
    {"small", 6, 384, 6, 256, 50257},
    {"gpt2-124m", 12, 768, 12, 1024, 50257},
    {"gpt2-350m", 24, 1024, 16, 1024, 50257},
    {"gpt2-774m", 36, 1280, 20, 1024, 50257},
    {"gpt2-1.5b", 48, 1600, 25, 1024, 50257},
    {"gpt-7b", 32, 4096, 32, 2048, 50257},
    {"gpt-13b", 40, 5120, 40, 2048, 50257},
    {"gpt3-175b", 96, 12288, 96, 2048, 51200},
    {"gpt-530b", 105, 20480, 128, 2048, 51200},
    {"gpt-1t", 128, 25600, 160, 2048, 51200},
}};

}  // namespace

absl::string_view PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp32") return Precision::kFp32;
  return absl::InvalidArgumentError(
      absl::StrCat("train.precision \"", name, "\" is not one of: bf16, fp32"));
}

absl::StatusOr<ModelShape> ResolvePreset(absl::string_view preset) {
  for (const Preset& p : kPresets) {
    if (preset == p.name) {
      return ModelShape{p.name, p.layers, p.hidden, p.heads, p.seq_len, p.vocab};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model.preset \"", preset, "\" is unknown; one of: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

absl::Status ValidateModel(const ModelShape& m) {
  struct Field {
    const char* name;
    int value;
  };
  for (const Field& f :
       {Field{"layers", m.layers}, Field{"hidden", m.hidden}, Field{"heads", m.heads},
        Field{"seq_len", m.seq_len}, Field{"vocab", m.vocab}}) {
    if (f.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.", f.name, " must be > 0, got ", f.value));
    }
  }
  if (m.hidden % m.heads != 0) {
    const int below = m.hidden / m.heads * m.heads;
    const int above = below + m.heads;
    return absl::InvalidArgumentError(
        absl::StrCat("model.hidden ", m.hidden, " is not divisible by model.heads ", m.heads,
                     ": use hidden ", below > 0 ? absl::StrCat(below, " or ") : "", above));
  }
  return absl::OkStatus();
}

double BlockParams(const ModelShape& m, int tp) {
  const double h = m.hidden, t = tp;
  return 12.0 * h * h / t + 7.0 * h / t + 6.0 * h;
}

double EmbeddingParams(const ModelShape& m, int tp) {
  return double(m.vocab) * m.hidden / tp + double(m.seq_len) * m.hidden;
}

double HeadParams(const ModelShape& m, int tp, int pp) {
  const double ln_f = 2.0 * m.hidden;
  return pp > 1 ? ln_f + double(m.vocab) * m.hidden / tp : ln_f;
}

double TotalParams(const ModelShape& m) {
  return m.layers * BlockParams(m, 1) + EmbeddingParams(m, 1) + HeadParams(m, 1, 1);
}

double ModelFlopsPerToken(const ModelShape& m) {
  const double h = m.hidden, L = m.layers;
  const double n = 12.0 * L * h * h + double(m.vocab) * h;
  return 6.0 * n + 6.0 * L * h * m.seq_len;
}

}  // namespace loom::planner
