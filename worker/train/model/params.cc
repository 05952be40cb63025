#include "worker/train/model/params.h"

#include <cmath>

#include "worker/train/error.h"
#include "worker/train/rng.h"

namespace loom::train {

namespace {

// Tensor indices in llm.c's order (the order of ParamTable).
enum : int {
  kWte = 0,
  kWpe,
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kAttprojw,
  kAttprojb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcprojw,
  kFcprojb,
  kLnfw,
  kLnfb,
};

// The SplitMix64 increment: Rng's state advances by it on every NextU64, so a stream can be
// entered at any position without drawing the values before it.
constexpr uint64_t kRngStep = 0x9e3779b97f4a7c15ULL;

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t s : v) p *= s;
  return p;
}

// Fills t's view, box and local shape for the box [start, start + size) of a tensor viewed as
// `view`. `local_shape` is the box read in the tensor's own (not view) dimensions; held == false
// makes an empty tensor (box of size 0 in the leading dimension).
void SetBox(TensorInfo* t, std::vector<int64_t> view, std::vector<int64_t> start,
            std::vector<int64_t> size, std::vector<int64_t> local_shape, bool held) {
  t->view_shape = std::move(view);
  if (!held) {
    // Nothing held: a box of no elements at the origin; the leading dimension is 0.
    start.assign(start.size(), 0);
    size[0] = 0;
    local_shape[0] = 0;
  }
  t->box_start = std::move(start);
  t->box_size = std::move(size);
  t->shape = std::move(local_shape);
  t->numel = static_cast<size_t>(Product(t->box_size));
}

}  // namespace

std::string ShardProblem(const ModelDims& d, const ModelShard& s) {
  const std::string tp = std::to_string(s.tp_size);
  if (s.tp_size < 1) {
    return "tensor parallel size " + tp + " is below 1 (parallelism.tensor); use 1 or more";
  }
  if (s.tp_rank < 0 || s.tp_rank >= s.tp_size) {
    return "tensor parallel rank " + std::to_string(s.tp_rank) + " is outside [0, " + tp +
           ") (the tensor group's size)";
  }
  if (d.heads % s.tp_size != 0) {
    return "tensor parallel " + tp + " does not divide the " + std::to_string(d.heads) +
           " heads (model.heads); use a tensor size that divides it";
  }
  if ((4 * d.channels) % s.tp_size != 0) {
    return "tensor parallel " + tp + " does not divide the MLP width 4 * " +
           std::to_string(d.channels) + " (model.hidden); use a tensor size that divides it";
  }
  const int last = s.last_block == -1 ? d.layers : s.last_block;
  const std::string range =
      "pipeline stage blocks [" + std::to_string(s.first_block) + ", " + std::to_string(last) + ")";
  if (s.first_block < 0) return range + " start below block 0; first_block must be >= 0";
  if (last > d.layers) {
    return range + " run past the model's " + std::to_string(d.layers) +
           " blocks (model.layers); last_block must be at most " + std::to_string(d.layers);
  }
  if (s.first_block >= last) {
    return range + " hold no block; every stage needs first_block < last_block";
  }
  return "";
}

std::vector<TensorInfo> ParamTable(const ModelDims& d) { return ShardTable(d, ModelShard{}); }

std::vector<TensorInfo> ShardTable(const ModelDims& d, const ModelShard& shard) {
  const std::string problem = ShardProblem(d, shard);
  LOOM_CHECK(problem.empty(), "invalid model shard: " + problem);
  const int64_t V = d.vocab, C = d.channels, L = d.layers, maxT = d.max_seq_len;
  const int64_t tp = shard.tp_size, r = shard.tp_rank;
  const int64_t fb = shard.first_block;
  const int64_t nb = (shard.last_block == -1 ? L : shard.last_block) - fb;  // blocks held
  const bool first = fb == 0, last = fb + nb == L;
  const int64_t Cl = C / tp;    // this rank's q (or k, or v) channels: its heads times HS
  const int64_t F = 4 * C;      // MLP width
  const int64_t Fl = F / tp;    // this rank's MLP slice
  const bool split = tp > 1;    // tp_split of the Megatron-sliced tensors
  const bool tp_lead = r == 0;  // holds the owner copy of every tp-replicated tensor

  std::vector<TensorInfo> table(kNumParamTensors);
  const char* names[kNumParamTensors] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                                         "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                                         "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
  for (int i = 0; i < kNumParamTensors; ++i) {
    TensorInfo& t = table[i];
    t.name = names[i];
    t.decay = i == kWte || i == kWpe || i == kQkvw || i == kAttprojw || i == kFcw || i == kFcprojw;
  }
  // Embeddings and the final layernorm: whole tensors, on the stages that use them.
  auto whole = [&](int i, std::vector<int64_t> shape, bool held, bool owner) {
    TensorInfo& t = table[i];
    t.global_shape = shape;
    SetBox(&t, shape, std::vector<int64_t>(shape.size(), 0), shape, shape, held);
    t.owner = held && owner && tp_lead;
  };
  whole(kWte, {V, C}, first || last, first);  // tied head: the first stage's copy is saved
  whole(kWpe, {maxT, C}, first, true);
  whole(kLnfw, {C}, last, true);
  whole(kLnfb, {C}, last, true);

  // Per-block tensors: the stage's layers, sliced over tp where Megatron splits them.
  auto stacked = [&](int i, std::vector<int64_t> global, std::vector<int64_t> view,
                     std::vector<int64_t> start, std::vector<int64_t> size,
                     std::vector<int64_t> local, bool tp_split) {
    TensorInfo& t = table[i];
    t.global_shape = std::move(global);
    t.stacked = true;
    t.tp_split = tp_split && split;
    SetBox(&t, std::move(view), std::move(start), std::move(size), std::move(local), true);
    t.owner = tp_split || tp_lead;
  };
  auto replicated = [&](int i, int64_t width) {
    stacked(i, {L, width}, {L, width}, {fb, 0}, {nb, width}, {nb, width}, false);
  };
  replicated(kLn1w, C);
  replicated(kLn1b, C);
  // Column-parallel: rows of this rank's heads in each of q, k and v.
  stacked(kQkvw, {L, 3 * C, C}, {L, 3, C, C}, {fb, 0, r * Cl, 0}, {nb, 3, Cl, C}, {nb, 3 * Cl, C},
          true);
  stacked(kQkvb, {L, 3 * C}, {L, 3, C}, {fb, 0, r * Cl}, {nb, 3, Cl}, {nb, 3 * Cl}, true);
  // Row-parallel: the input columns of the same heads.
  stacked(kAttprojw, {L, C, C}, {L, C, C}, {fb, 0, r * Cl}, {nb, C, Cl}, {nb, C, Cl}, true);
  replicated(kAttprojb, C);
  replicated(kLn2w, C);
  replicated(kLn2b, C);
  stacked(kFcw, {L, F, C}, {L, F, C}, {fb, r * Fl, 0}, {nb, Fl, C}, {nb, Fl, C}, true);
  stacked(kFcb, {L, F}, {L, F}, {fb, r * Fl}, {nb, Fl}, {nb, Fl}, true);
  stacked(kFcprojw, {L, C, F}, {L, C, F}, {fb, 0, r * Fl}, {nb, C, Fl}, {nb, C, Fl}, true);
  replicated(kFcprojb, C);

  size_t offset = 0;
  for (TensorInfo& t : table) {
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
    if (t.numel == 0) continue;
    float* p = base + t.offset;
    const bool layernorm_weight = t.name == "ln1w" || t.name == "ln2w" || t.name == "lnfw";
    if (layernorm_weight) {
      for (size_t j = 0; j < t.numel; ++j) p[j] = 1.0f;
      continue;
    }
    if (!t.decay) {  // biases
      for (size_t j = 0; j < t.numel; ++j) p[j] = 0.0f;
      continue;
    }
    const double std_dev = (t.name == "attprojw" || t.name == "fcprojw") ? residual_std : kStd;
    const uint64_t stream = HashTuple(seed, 0x1a17, i);
    // The whole tensor's element e (row-major in the view, which is row-major in the tensor)
    // is the e-th normal of `stream`, and each normal takes two steps of the generator. Walk the
    // box one innermost run at a time, entering the stream at the run's first element, so a
    // shard draws only the values it keeps and a whole tensor draws exactly as one sequential
    // stream did (bit-identical to the single-rank init).
    const std::vector<int64_t>& view = t.view_shape;
    const size_t dims = view.size();
    const int64_t run = t.box_size[dims - 1];
    std::vector<int64_t> index(dims - 1, 0);  // position in the box, outer dimensions
    size_t out = 0;
    while (out < t.numel) {
      int64_t e = 0;  // global element of the run's first value
      for (size_t k = 0; k < dims; ++k) {
        const int64_t coord = t.box_start[k] + (k + 1 < dims ? index[k] : 0);
        e = e * view[k] + coord;
      }
      Rng rng(stream + 2 * static_cast<uint64_t>(e) * kRngStep);
      for (int64_t j = 0; j < run; ++j) p[out++] = static_cast<float>(std_dev * rng.NextNormal());
      for (size_t k = dims - 1; k-- > 0;) {  // odometer over the outer box dimensions
        if (++index[k] < t.box_size[k]) break;
        index[k] = 0;
      }
    }
  }
}

}  // namespace loom::train
