// The shape of a GPT-2-architecture model as the planner sees it: the five dimensions, the
// presets of docs/rank-contract.md, and the parameter and FLOP counts derived from them.
// Plain structs, no protobuf: the RPC layer maps ModelSpec onto ModelShape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::planner {

enum class Precision {
  kBf16,  // bf16 weights, activations and grads; fp32 master weights and Adam moments
  kFp32,  // everything in fp32 (the CPU backend's default)
};

absl::string_view PrecisionName(Precision p);  // "bf16" | "fp32"
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

// Bytes of one stored activation element: the Korthikanti et al. formula counts 16-bit values.
inline double ActivationBytes(Precision p) { return p == Precision::kBf16 ? 2.0 : 4.0; }

struct ModelShape {
  std::string name;  // preset name, or "custom"
  int layers = 0;    // L, transformer blocks
  int hidden = 0;    // h (C), channels
  int heads = 0;     // a (NH)
  int seq_len = 0;   // s (T), tokens per sequence and size of the position table
  int vocab = 0;     // V
};

// The presets of docs/rank-contract.md plus a few larger GPT shapes used for planning ahead
// (gpt3-175b and gpt-1t follow Narayanan et al. 2021, Table 1).
absl::StatusOr<ModelShape> ResolvePreset(absl::string_view preset);
std::vector<std::string> PresetNames();

// INVALID_ARGUMENT naming the field and the nearest valid value, e.g.
// "model.hidden 1000 is not divisible by model.heads 12: use hidden 996 or 1008".
absl::Status ValidateModel(const ModelShape& m);

// Parameters of one block held by one of `tp` tensor-parallel ranks. Megatron split of a GPT-2
// block: QKV (3h² + 3h) and MLP-up (4h² + 4h) are column-parallel, attention-out and MLP-down
// weights (h² and 4h²) row-parallel with their biases (h each) replicated, as are the two
// layernorms (4h): 12h²/t + 7h/t + 6h, which is 12h² + 13h at t = 1.
double BlockParams(const ModelShape& m, int tp);

// Token embedding (vocab-parallel, V·h/t) plus the replicated position table (s·h).
double EmbeddingParams(const ModelShape& m, int tp);

// Final layernorm (2h) plus, when the last stage is not the first (pp > 1), its own copy of the
// tied token embedding for the output head (V·h/t), kept in sync by Megatron's embedding
// all-reduce between the first and last stage.
double HeadParams(const ModelShape& m, int tp, int pp);

// All parameters of the model: L·(12h² + 13h) + V·h + s·h + 2h (tied head). 124,439,808 for
// gpt2-124m.
double TotalParams(const ModelShape& m);

// Model FLOPs per trained token, forward plus backward, without recompute: the standard
// 6·N for the matmul weights (N = 12·L·h² + V·h, the head counted, biases and position table
// not) plus causal attention 6·L·h·s (QKᵀ and AV over the lower triangle: 2·L·h·s forward,
// twice that backward). Used for MFU, as in Chowdhery et al. 2022 (PaLM, appendix B).
double ModelFlopsPerToken(const ModelShape& m);

}  // namespace loom::planner
