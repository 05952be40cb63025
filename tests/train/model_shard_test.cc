// Tensor- and pipeline-parallel shards of the GPT model (DESIGN.md, "TP", "PP" and "The
// invariance principle"): the shard tables, the shards' initial weights, and the forward and
// backward passes of every layout against the whole model on the same micro-batches.
//
// Pipelines run in one thread, stage after stage in a 1F1B order with two micro-batches in
// flight (the stage's activation slots); tensor-parallel ranks run as threads of this process,
// each with a Gloo communicator (skipped where CMake found no Gloo).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/model/gpt.h"
#include "worker/train/rng.h"
#ifdef LOOM_HAVE_GLOO
#include "worker/train/comm/gloo_communicator.h"
#endif

namespace loom::train {
namespace {

using testing::TempDir;

//                         L   C  NH maxT   V
const ModelDims kDims = {4, 64, 4, 32, 256};
constexpr int kB = 2, kT = 16;
constexpr int kMicro = 2;  // micro-batches per step

// Stage boundaries: stage s holds blocks [bounds[s], bounds[s + 1]).
using Bounds = std::vector<int>;

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

// For each local element of t, in local order, its flat index in the whole model's tensor.
std::vector<size_t> BoxIndices(const TensorInfo& t) {
  std::vector<size_t> out;
  out.reserve(t.numel);
  const size_t dims = t.view_shape.size();
  std::vector<int64_t> index(dims, 0);
  for (size_t n = 0; n < t.numel; ++n) {
    size_t e = 0;
    for (size_t k = 0; k < dims; ++k) e = e * t.view_shape[k] + t.box_start[k] + index[k];
    out.push_back(e);
    for (size_t k = dims; k-- > 0;) {
      if (++index[k] < t.box_size[k]) break;
      index[k] = 0;
    }
  }
  return out;
}

ModelShard Shard(int tp, int rank, int first, int last) {
  ModelShard s;
  s.tp_size = tp;
  s.tp_rank = rank;
  s.first_block = first;
  s.last_block = last;
  return s;
}

// ---------------------------------------------------------------------------------------------
// (a) The tables.

TEST(ShardTableTest, WholeModelIsTheParamTable) {
  const std::vector<TensorInfo> a = ParamTable(kDims);
  const std::vector<TensorInfo> b = ShardTable(kDims, ModelShard{});
  ASSERT_EQ(a.size(), 16u);
  ASSERT_EQ(b.size(), 16u);
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(a[i].offset, b[i].offset);
    EXPECT_EQ(a[i].numel, b[i].numel);
    EXPECT_EQ(a[i].decay, b[i].decay);
    EXPECT_EQ(a[i].global_shape, a[i].shape);
    EXPECT_EQ(a[i].box_size, a[i].view_shape);
    EXPECT_EQ(a[i].box_start, std::vector<int64_t>(a[i].view_shape.size(), 0));
    EXPECT_EQ(Product(a[i].view_shape), Product(a[i].global_shape));
    EXPECT_FALSE(a[i].tp_split);
    EXPECT_TRUE(a[i].owner);
    EXPECT_EQ(a[i].stacked, a[i].global_shape.size() > 1 && a[i].global_shape[0] == kDims.layers &&
                                a[i].name != "wte" && a[i].name != "wpe");
  }
  EXPECT_EQ(a[4].view_shape, (std::vector<int64_t>{4, 3, 64, 64}));  // qkvw
  EXPECT_EQ(a[5].view_shape, (std::vector<int64_t>{4, 3, 64}));      // qkvb
}

struct Expected {
  std::string name;
  std::vector<int64_t> shape, box_start, box_size;
  bool tp_split, owner;
};

TEST(ShardTableTest, BoxesOfAMiddleStageOnTensorRankOne) {
  // tp = 2, rank 1 holds heads 2..3 (channels 32..63 of q, k, v) and MLP rows 128..255.
  const std::vector<TensorInfo> t = ShardTable(kDims, Shard(2, 1, 1, 3));
  const std::vector<Expected> expected = {
      {"wte", {0, 64}, {0, 0}, {0, 64}, false, false},
      {"wpe", {0, 64}, {0, 0}, {0, 64}, false, false},
      {"ln1w", {2, 64}, {1, 0}, {2, 64}, false, false},
      {"ln1b", {2, 64}, {1, 0}, {2, 64}, false, false},
      {"qkvw", {2, 96, 64}, {1, 0, 32, 0}, {2, 3, 32, 64}, true, true},
      {"qkvb", {2, 96}, {1, 0, 32}, {2, 3, 32}, true, true},
      {"attprojw", {2, 64, 32}, {1, 0, 32}, {2, 64, 32}, true, true},
      {"attprojb", {2, 64}, {1, 0}, {2, 64}, false, false},
      {"ln2w", {2, 64}, {1, 0}, {2, 64}, false, false},
      {"ln2b", {2, 64}, {1, 0}, {2, 64}, false, false},
      {"fcw", {2, 128, 64}, {1, 128, 0}, {2, 128, 64}, true, true},
      {"fcb", {2, 128}, {1, 128}, {2, 128}, true, true},
      {"fcprojw", {2, 64, 128}, {1, 0, 128}, {2, 64, 128}, true, true},
      {"fcprojb", {2, 64}, {1, 0}, {2, 64}, false, false},
      {"lnfw", {0}, {0}, {0}, false, false},
      {"lnfb", {0}, {0}, {0}, false, false},
  };
  ASSERT_EQ(t.size(), expected.size());
  size_t offset = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    SCOPED_TRACE(t[i].name);
    EXPECT_EQ(t[i].name, expected[i].name);
    EXPECT_EQ(t[i].shape, expected[i].shape);
    EXPECT_EQ(t[i].box_start, expected[i].box_start);
    EXPECT_EQ(t[i].box_size, expected[i].box_size);
    EXPECT_EQ(t[i].tp_split, expected[i].tp_split);
    EXPECT_EQ(t[i].owner, expected[i].owner);
    EXPECT_EQ(t[i].numel, static_cast<size_t>(Product(t[i].shape)));
    EXPECT_EQ(t[i].numel, static_cast<size_t>(Product(t[i].box_size)));
    EXPECT_EQ(t[i].offset, offset);  // packed over the held tensors
    offset += t[i].numel;
  }
  EXPECT_EQ(ParamCount(t), offset);
}

TEST(ShardTableTest, EmbeddingsAndHeadFollowTheStages) {
  const auto first = ShardTable(kDims, Shard(1, 0, 0, 2));
  const auto last = ShardTable(kDims, Shard(1, 0, 2, 4));
  const auto last_rank1 = ShardTable(kDims, Shard(2, 1, 2, 4));
  // wte on both ends, saved from the first; wpe first only; lnf last only.
  EXPECT_EQ(first[0].numel, 256u * 64);
  EXPECT_TRUE(first[0].owner);
  EXPECT_EQ(last[0].numel, 256u * 64);
  EXPECT_FALSE(last[0].owner);
  EXPECT_EQ(first[1].numel, 32u * 64);
  EXPECT_EQ(last[1].numel, 0u);
  EXPECT_EQ(first[14].numel, 0u);
  EXPECT_EQ(last[14].numel, 64u);
  EXPECT_TRUE(last[14].owner);
  EXPECT_FALSE(last_rank1[14].owner);  // a tp replica
  EXPECT_EQ(last[2].box_start, (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(last[2].stacked);
  // The two stages hold the model plus a second copy of wte.
  EXPECT_EQ(ParamCount(first) + ParamCount(last), ParamCount(ParamTable(kDims)) + 256u * 64);
}

// In every layout the owner copies cover each element of the whole model exactly once, and
// every held copy lies inside the whole tensor.
TEST(ShardTableTest, OwnersPartitionTheModelInEveryLayout) {
  const std::vector<TensorInfo> whole = ParamTable(kDims);
  for (int tp : {1, 2, 4}) {
    for (const Bounds& bounds : {Bounds{0, 4}, Bounds{0, 1, 4}, Bounds{0, 2, 3, 4}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + ", stages " + std::to_string(bounds.size() - 1));
      std::vector<std::vector<int>> count(16);
      for (int i = 0; i < 16; ++i) count[i].assign(whole[i].numel, 0);
      for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        for (int r = 0; r < tp; ++r) {
          const auto table = ShardTable(kDims, Shard(tp, r, bounds[s], bounds[s + 1]));
          for (int i = 0; i < 16; ++i) {
            EXPECT_EQ(table[i].global_shape, whole[i].global_shape);
            for (size_t e : BoxIndices(table[i])) {
              ASSERT_LT(e, whole[i].numel) << table[i].name;
              if (table[i].owner) ++count[i][e];
            }
          }
        }
      }
      for (int i = 0; i < 16; ++i) {
        for (size_t e = 0; e < count[i].size(); ++e) {
          ASSERT_EQ(count[i][e], 1) << whole[i].name << " element " << e;
        }
      }
    }
  }
}

TEST(ShardProblemTest, NamesTheFieldAndTheFix) {
  struct Case {
    ModelShard shard;
    std::string expect;  // a substring of the message; "" for a valid shard
  };
  const std::vector<Case> cases = {
      {Shard(1, 0, 0, -1), ""},
      {Shard(4, 3, 1, 2), ""},
      {Shard(2, 0, 3, 4), ""},
      {Shard(3, 0, 0, 4), "tensor parallel 3 does not divide the 4 heads (model.heads)"},
      {Shard(8, 0, 0, 4), "model.heads"},
      {Shard(0, 0, 0, 4), "parallelism.tensor"},
      {Shard(2, 2, 0, 4), "rank 2 is outside [0, 2)"},
      {Shard(2, -1, 0, 4), "rank -1"},
      {Shard(1, 0, 2, 2), "first_block < last_block"},
      {Shard(1, 0, 3, 1), "first_block < last_block"},
      {Shard(1, 0, 0, 5), "last_block must be at most 4"},
      {Shard(1, 0, -1, 2), "first_block must be >= 0"},
  };
  for (const Case& c : cases) {
    const std::string problem = ShardProblem(kDims, c.shard);
    SCOPED_TRACE("tp " + std::to_string(c.shard.tp_size) + " rank " +
                 std::to_string(c.shard.tp_rank) + " blocks " +
                 std::to_string(c.shard.first_block) + ".." + std::to_string(c.shard.last_block));
    if (c.expect.empty()) {
      EXPECT_EQ(problem, "");
    } else {
      EXPECT_NE(problem.find(c.expect), std::string::npos) << problem;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// (b) Initial weights.

TEST(ShardInitTest, EveryShardStartsFromItsBoxOfTheWholeModel) {
  GPT whole(kDims);
  whole.InitWeights(1234);
  for (int tp : {1, 2, 4}) {
    for (const Bounds& bounds : {Bounds{0, 4}, Bounds{0, 1, 4}, Bounds{0, 2, 3, 4}}) {
      for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        for (int r = 0; r < tp; ++r) {
          const ModelShard shard = Shard(tp, r, bounds[s], bounds[s + 1]);
          const auto table = ShardTable(kDims, shard);
          std::vector<float> params(ParamCount(table), -7.0f);
          InitParams(params.data(), table, kDims.layers, 1234);
          for (int i = 0; i < 16; ++i) {
            const std::vector<size_t> idx = BoxIndices(table[i]);
            const float* global = whole.params() + whole.tensors()[i].offset;
            for (size_t j = 0; j < idx.size(); ++j) {
              ASSERT_EQ(params[table[i].offset + j], global[idx[j]])
                  << table[i].name << " tp " << tp << " rank " << r << " stage " << s;
            }
          }
        }
      }
    }
  }
  // And through the model: a sharded GPT's InitWeights is the same init.
  GPT stage(kDims, Shard(1, 0, 2, 4));
  stage.InitWeights(1234);
  const TensorInfo& fcw = stage.tensors()[10];
  const std::vector<size_t> idx = BoxIndices(fcw);
  const float* global = whole.params() + whole.tensors()[10].offset;
  for (size_t j = 0; j < idx.size(); ++j) ASSERT_EQ(stage.params()[fcw.offset + j], global[idx[j]]);
}

// ---------------------------------------------------------------------------------------------
// (c, d, e) Forward and backward of a layout against the whole model.

struct MicroBatch {
  std::vector<int> tokens, targets;  // (B, T)
};

std::vector<MicroBatch> MicroBatches(uint64_t seed) {
  Rng rng(seed);
  std::vector<MicroBatch> out(kMicro);
  for (MicroBatch& m : out) {
    for (int i = 0; i < kB * kT; ++i) {
      m.tokens.push_back(static_cast<int>(rng.NextBelow(kDims.vocab)));
      m.targets.push_back(static_cast<int>(rng.NextBelow(kDims.vocab)));
    }
  }
  return out;
}

// GPT-2's init has zero biases and unit layernorm weights, which would hide a bias added once
// per tp rank instead of once. Moves every parameter by a small amount that is a function of
// its place in the whole model, so every layout still holds the same model.
void Perturb(GPT* g) {
  for (int i = 0; i < 16; ++i) {
    const TensorInfo& t = g->tensors()[i];
    const std::vector<size_t> idx = BoxIndices(t);
    for (size_t j = 0; j < idx.size(); ++j) {
      Rng rng(HashTuple(0x5eed, i, idx[j]));
      g->params()[t.offset + j] += static_cast<float>(0.05 * (rng.NextUniform() - 0.5));
    }
  }
}

// What one rank (one stage, one tp rank) ends with.
struct RankResult {
  std::vector<TensorInfo> table;
  std::vector<float> grads;
  std::vector<int> ready;     // the GradReadyFn stages of the last micro-batch, in order
  std::vector<float> losses;  // per micro-batch, on the last stage
};

// Runs one step of kMicro micro-batches over the stages `bounds` of one tp rank, in a 1F1B
// order, on this thread. comms[s] is stage s's tp communicator (nullptr for tp = 1). Returns one
// RankResult per stage. Activations and gradients pass between stages as copies (as a send
// would), so each stage's Output/InputGrad is read right after the call that produced it.
std::vector<RankResult> RunPipeline(int tp, int rank, const Bounds& bounds,
                                    const std::vector<Communicator*>& comms,
                                    const std::vector<MicroBatch>& data) {
  const int S = static_cast<int>(bounds.size()) - 1;
  const size_t NC = static_cast<size_t>(kB) * kT * kDims.channels;
  std::vector<std::unique_ptr<GPT>> stages;
  std::vector<int> slots(S);
  for (int s = 0; s < S; ++s) {
    stages.push_back(
        std::make_unique<GPT>(kDims, Shard(tp, rank, bounds[s], bounds[s + 1]), comms[s]));
    stages[s]->InitWeights(99);
    Perturb(stages[s].get());
    stages[s]->ZeroGrad();
    slots[s] = std::min(kMicro, S - s);  // 1F1B keeps at most S - s micro-batches in flight
    stages[s]->Reserve(kB, kT, slots[s]);
  }
  // Per stage: warm-up forwards, then one forward and one backward in turn, then the rest.
  struct Op {
    bool forward;
    int micro;
  };
  std::vector<std::vector<Op>> ops(S);
  for (int s = 0; s < S; ++s) {
    const int warmup = std::min(S - 1 - s, kMicro);
    for (int m = 0; m < warmup; ++m) ops[s].push_back({true, m});
    for (int m = 0; m < kMicro; ++m) {
      if (warmup + m < kMicro) ops[s].push_back({true, warmup + m});
      ops[s].push_back({false, m});
    }
  }
  std::vector<std::vector<std::vector<float>>> out(S), din(S);  // [stage][micro] (B, T, C)
  std::vector<std::vector<bool>> fdone(S, std::vector<bool>(kMicro)), bdone = fdone;
  std::vector<size_t> next(S, 0);
  std::vector<RankResult> results(S);
  for (int s = 0; s < S; ++s) {
    out[s].resize(kMicro);
    din[s].resize(kMicro);
    results[s].losses.assign(kMicro, 0.0f);
  }
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      if (next[s] == ops[s].size()) continue;
      const Op op = ops[s][next[s]];
      const int m = op.micro, slot = m % slots[s];
      GPT& g = *stages[s];
      if (op.forward) {
        if (s > 0 && !fdone[s - 1][m]) continue;
        const float loss =
            g.ForwardMicro(slot, data[m].tokens.data(), s > 0 ? out[s - 1][m].data() : nullptr,
                           data[m].targets.data());
        if (s == S - 1) results[s].losses[m] = loss;
        out[s][m].assign(g.Output(slot), g.Output(slot) + NC);
        fdone[s][m] = true;
      } else {
        if (s < S - 1 && !bdone[s + 1][m]) continue;
        results[s].ready.clear();
        g.BackwardMicro(slot, 1.0f / kMicro, s < S - 1 ? din[s + 1][m].data() : nullptr,
                        [&results, s](int stage) { results[s].ready.push_back(stage); });
        if (s > 0) din[s][m].assign(g.InputGrad(), g.InputGrad() + NC);
        bdone[s][m] = true;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < S; ++s) {
    EXPECT_EQ(next[s], ops[s].size()) << "stage " << s << " stalled";
    results[s].table = stages[s]->tensors();
    results[s].grads.assign(stages[s]->grads(), stages[s]->grads() + stages[s]->num_params());
  }
  return results;
}

// The whole model on the same micro-batches: losses and the summed gradients.
struct Reference {
  std::vector<float> losses;
  std::vector<TensorInfo> table;
  std::vector<float> grads;
};

Reference WholeModel(const std::vector<MicroBatch>& data) {
  GPT g(kDims);
  g.InitWeights(99);
  Perturb(&g);
  g.ZeroGrad();
  Reference ref;
  for (const MicroBatch& m : data) {
    ref.losses.push_back(g.Forward(m.tokens.data(), m.targets.data(), kB, kT));
    g.Backward(1.0f / kMicro);
  }
  ref.table = g.tensors();
  ref.grads.assign(g.grads(), g.grads() + g.num_params());
  return ref;
}

// Compares every rank's result of one layout (results[tp_rank][stage]) with the whole model:
// losses to 1e-6 relative; gradients assembled into global coordinates from the owner copies
// (wte summed over the first and the last stage) to 1e-5 relative per tensor; and every tp
// replica against the whole model's box too.
void ExpectMatchesWholeModel(const std::vector<std::vector<RankResult>>& results,
                             const Reference& ref) {
  const int tp = static_cast<int>(results.size());
  std::vector<std::vector<double>> assembled(16);
  for (int i = 0; i < 16; ++i) assembled[i].assign(ref.table[i].numel, 0.0);
  for (int r = 0; r < tp; ++r) {
    const RankResult& last = results[r].back();
    for (int m = 0; m < kMicro; ++m) {
      EXPECT_NEAR(last.losses[m], ref.losses[m], 1e-6 * std::fabs(ref.losses[m]))
          << "micro-batch " << m << " tp rank " << r;
    }
    for (const RankResult& stage : results[r]) {
      for (int i = 0; i < 16; ++i) {
        const TensorInfo& t = stage.table[i];
        const std::vector<size_t> idx = BoxIndices(t);
        const float* local = stage.grads.data() + t.offset;
        const float* global = ref.grads.data() + ref.table[i].offset;
        const bool head_copy = t.name == "wte" && !t.owner && r == 0;  // the last stage's wte
        if (t.owner || head_copy) {
          for (size_t j = 0; j < idx.size(); ++j) assembled[i][idx[j]] += local[j];
        } else if (t.numel > 0 && t.name != "wte") {
          // A tp replica: the whole gradient of a replicated tensor, like the owner's.
          double diff = 0, norm = 0;
          for (size_t j = 0; j < idx.size(); ++j) {
            diff += std::pow(local[j] - global[idx[j]], 2);
            norm += std::pow(global[idx[j]], 2);
          }
          EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << t.name << " replica, rank " << r;
        }
      }
    }
  }
  // Replicated tensors must stay bitwise equal across the tp group, or the replicas of one
  // parameter would drift apart under the optimizer: every rank computes their gradients from
  // the same all-reduced values in the same order.
  for (int r = 1; r < tp; ++r) {
    for (size_t s = 0; s < results[r].size(); ++s) {
      for (int i = 0; i < 16; ++i) {
        const TensorInfo& t = results[r][s].table[i];
        if (t.tp_split || t.numel == 0) continue;
        const float* mine = results[r][s].grads.data() + t.offset;
        const float* lead = results[0][s].grads.data() + results[0][s].table[i].offset;
        EXPECT_EQ(0, std::memcmp(mine, lead, t.numel * sizeof(float)))
            << t.name << " of stage " << s << " differs between tp ranks 0 and " << r;
      }
    }
  }
  for (int i = 0; i < 16; ++i) {
    const float* global = ref.grads.data() + ref.table[i].offset;
    double diff = 0, norm = 0;
    for (size_t e = 0; e < assembled[i].size(); ++e) {
      diff += std::pow(assembled[i][e] - global[e], 2);
      norm += std::pow(double(global[e]), 2);
    }
    EXPECT_GT(norm, 0.0) << ref.table[i].name;
    EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm))
        << ref.table[i].name << ": |diff| " << std::sqrt(diff) << ", |ref| " << std::sqrt(norm);
  }
}

// Runs a layout of tp ranks (threads, with a Gloo group per stage when tp > 1) and returns
// results[tp_rank][stage].
std::vector<std::vector<RankResult>> RunLayout(int tp, const Bounds& bounds,
                                               const std::vector<MicroBatch>& data) {
  const int S = static_cast<int>(bounds.size()) - 1;
  std::vector<std::vector<RankResult>> results(tp);
  if (tp == 1) {
    results[0] = RunPipeline(1, 0, bounds, std::vector<Communicator*>(S, nullptr), data);
    return results;
  }
#ifdef LOOM_HAVE_GLOO
  TempDir dir;
  std::vector<std::string> errors(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<std::unique_ptr<Communicator>> owned;
        std::vector<Communicator*> comms;
        for (int s = 0; s < S; ++s) {  // one tp group per stage, each with its own store
          GlooOptions options;
          options.rank = r;
          options.size = tp;
          options.store_dir = dir / ("stage" + std::to_string(s));
          options.timeout = std::chrono::seconds(30);
          std::filesystem::create_directories(options.store_dir);
          owned.push_back(ConnectGloo(options));
          comms.push_back(owned.back().get());
        }
        results[r] = RunPipeline(tp, r, bounds, comms, data);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "tp rank " << r;
#endif
  return results;
}

TEST(PipelineTest, TwoStagesMatchTheWholeModel) {
  const auto data = MicroBatches(5);
  const Reference ref = WholeModel(data);
  const auto results = RunLayout(1, {0, 2, 4}, data);
  ExpectMatchesWholeModel(results, ref);
  // Gradients become final stage by stage: head and lnf (L), the blocks downwards, embeddings.
  EXPECT_EQ(results[0][1].ready, (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(results[0][0].ready, (std::vector<int>{1, 0, -1}));
}

TEST(PipelineTest, ThreeUnevenStagesMatchTheWholeModel) {
  const auto data = MicroBatches(6);
  const auto results = RunLayout(1, {0, 1, 3, 4}, data);
  ExpectMatchesWholeModel(results, WholeModel(data));
  EXPECT_EQ(results[0][1].ready, (std::vector<int>{2, 1}));
}

TEST(PipelineTest, TwoSlotsOnOneStageAreTheWholeModelExactly) {
  // Both micro-batches forward into their own slots before either backward (as a first stage
  // of 1F1B does): the same bits as Forward/Backward one after the other, so slots share
  // nothing but the backward scratch.
  const auto data = MicroBatches(7);
  const Reference ref = WholeModel(data);
  GPT g(kDims);
  g.InitWeights(99);
  Perturb(&g);
  g.ZeroGrad();
  g.Reserve(kB, kT, 2);
  std::vector<float> losses;
  for (int m = 0; m < kMicro; ++m) {
    losses.push_back(g.ForwardMicro(m, data[m].tokens.data(), nullptr, data[m].targets.data()));
  }
  for (int m = 0; m < kMicro; ++m) g.BackwardMicro(m, 1.0f / kMicro, nullptr);
  EXPECT_EQ(losses, ref.losses);
  EXPECT_EQ(std::vector<float>(g.grads(), g.grads() + g.num_params()), ref.grads);
}

TEST(PipelineTest, BytesAllocatedCountSlotsAndShards) {
  GPT whole(kDims);
  whole.ZeroGrad();
  whole.Reserve(kB, kT, 1);
  const size_t one = whole.bytes_allocated();
  whole.Reserve(kB, kT, 2);
  const size_t two = whole.bytes_allocated();
  EXPECT_GT(two, one);  // a second slot of activations
  GPT middle(kDims, Shard(1, 0, 1, 3));
  middle.ZeroGrad();
  middle.Reserve(kB, kT, 2);
  EXPECT_LT(middle.bytes_allocated(), two);  // half the blocks, no embeddings or head
  EXPECT_EQ(middle.logits(), nullptr);
}

#ifdef LOOM_HAVE_GLOO
TEST(TensorParallelTest, TwoRanksMatchTheWholeModel) {
  const auto data = MicroBatches(8);
  ExpectMatchesWholeModel(RunLayout(2, {0, 4}, data), WholeModel(data));
}

TEST(TensorParallelTest, FourRanksMatchTheWholeModel) {
  const auto data = MicroBatches(9);
  ExpectMatchesWholeModel(RunLayout(4, {0, 4}, data), WholeModel(data));
}

TEST(TensorParallelTest, TwoRanksTimesTwoStagesMatchTheWholeModel) {
  const auto data = MicroBatches(10);
  ExpectMatchesWholeModel(RunLayout(2, {0, 2, 4}, data), WholeModel(data));
}
#else
TEST(TensorParallelTest, NeedsGloo) { GTEST_SKIP() << "built without Gloo"; }
#endif

}  // namespace
}  // namespace loom::train
