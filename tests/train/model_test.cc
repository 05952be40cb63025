// The GPT-2 model: parameter table, initialisation, forward invariants, and the backward pass
// against finite differences of the forward pass.
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/train/model/gpt.h"
#include "worker/train/rng.h"

namespace loom::train {
namespace {

// A batch of random tokens (B, T) and targets.
struct Batch {
  std::vector<int> inputs, targets;
};

Batch RandomBatch(int B, int T, int V, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(static_cast<int>(rng.NextBelow(V)));
    b.targets.push_back(static_cast<int>(rng.NextBelow(V)));
  }
  return b;
}

TEST(ParamTableTest, LlmcOrderAndGpt2Count) {
  std::vector<TensorInfo> table = ParamTable(*PresetDims("gpt2-124m"));
  const char* names[] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                         "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                         "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
  ASSERT_EQ(table.size(), 16u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(table[i].name, names[i]);
  // GPT-2 small has 124,439,808 parameters with the unpadded 50257-token vocabulary.
  EXPECT_EQ(ParamCount(table), 124439808u);
  EXPECT_EQ(table[4].shape, (std::vector<int64_t>{12, 2304, 768}));
  for (size_t i = 1; i < table.size(); ++i) {
    EXPECT_EQ(table[i].offset, table[i - 1].offset + table[i - 1].numel);
  }
}

TEST(InitTest, Gpt2InitialisationIsSeededAndScaled) {
  ModelDims dims = *PresetDims("tiny");
  GPT a(dims), b(dims), c(dims);
  a.InitWeights(7);
  b.InitWeights(7);
  c.InitWeights(8);
  ASSERT_EQ(a.num_params(), b.num_params());
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.num_params() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.params(), c.params(), a.num_params() * sizeof(float)));

  auto stats = [&](const std::string& name) {
    for (const TensorInfo& t : a.tensors()) {
      if (t.name != name) continue;
      double sum = 0, sq = 0;
      for (size_t i = 0; i < t.numel; ++i) {
        double x = a.params()[t.offset + i];
        sum += x;
        sq += x * x;
      }
      double mean = sum / t.numel;
      return std::make_pair(mean, std::sqrt(sq / t.numel - mean * mean));
    }
    return std::make_pair(-1.0, -1.0);
  };
  EXPECT_NEAR(stats("wte").second, 0.02, 0.001);
  EXPECT_NEAR(stats("fcw").second, 0.02, 0.001);
  EXPECT_NEAR(stats("attprojw").second, 0.02 / std::sqrt(2.0 * dims.layers), 0.001);
  EXPECT_NEAR(stats("fcprojw").second, 0.02 / std::sqrt(2.0 * dims.layers), 0.001);
  EXPECT_EQ(stats("ln1w"), std::make_pair(1.0, 0.0));
  EXPECT_EQ(stats("lnfw"), std::make_pair(1.0, 0.0));
  EXPECT_EQ(stats("qkvb"), std::make_pair(0.0, 0.0));
  EXPECT_EQ(stats("lnfb"), std::make_pair(0.0, 0.0));
}

TEST(ForwardTest, InitialLossIsNearUniformAndLogitsAreCausal) {
  ModelDims dims = *PresetDims("tiny");
  GPT model(dims);
  model.InitWeights(1);
  const int B = 2, T = 16;
  Batch batch = RandomBatch(B, T, dims.vocab, 3);
  float loss = model.Forward(batch.inputs.data(), batch.targets.data(), B, T);
  // Small initial weights give near-uniform predictions: loss close to ln V.
  EXPECT_NEAR(loss, std::log(static_cast<double>(dims.vocab)), 0.1);

  std::vector<float> before(model.logits(), model.logits() + B * T * dims.vocab);
  batch.inputs[10] = (batch.inputs[10] + 1) % dims.vocab;  // sequence 0, position 10
  model.Forward(batch.inputs.data(), nullptr, B, T);
  const float* after = model.logits();
  for (int t = 0; t < T; ++t) {
    bool same = std::memcmp(&before[t * dims.vocab], &after[t * dims.vocab],
                            dims.vocab * sizeof(float)) == 0;
    EXPECT_EQ(same, t < 10) << "position " << t;  // the past does not see the future
  }
  // Sequence 1 is independent of sequence 0.
  EXPECT_EQ(0, std::memcmp(&before[T * dims.vocab], &after[T * dims.vocab],
                           T * dims.vocab * sizeof(float)));
}

TEST(BackwardTest, AccumulationOfScaledHalvesEqualsOneFullStep) {
  ModelDims dims = *PresetDims("tiny");
  GPT model(dims);
  model.InitWeights(2);
  Batch batch = RandomBatch(2, 16, dims.vocab, 4);
  model.ZeroGrad();
  model.Forward(batch.inputs.data(), batch.targets.data(), 2, 16);
  model.Backward(1.0f);
  std::vector<float> full(model.grads(), model.grads() + model.num_params());
  model.ZeroGrad();
  for (int i = 0; i < 2; ++i) {
    model.Forward(batch.inputs.data(), batch.targets.data(), 2, 16);
    model.Backward(0.5f);
  }
  // Scaling by a power of two is exact, but a gradient summed from several contributions (the
  // tied wte, wpe over the batch, blocked bias reductions) adds them in another order when
  // accumulated twice: equal to within rounding, tensor by tensor.
  for (const TensorInfo& t : model.tensors()) {
    const float* g = model.grads() + t.offset;
    double diff = 0, ref = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      diff += std::pow(double{full[t.offset + i]} - g[i], 2);
      ref += std::pow(double{full[t.offset + i]}, 2);
    }
    EXPECT_LT(std::sqrt(diff), 1e-6 * std::sqrt(ref)) << t.name;
    EXPECT_GT(ref, 0.0) << t.name;
  }
  double norm = 0;
  for (float g : full) norm += double{g} * g;
  EXPECT_GT(norm, 0.0);
}

// Central finite differences of the fp32 forward pass against the backward pass, for every
// parameter tensor: along the tensor's own gradient direction (which must give the gradient's
// norm) and on the single element with the largest gradient.
TEST(BackwardTest, MatchesFiniteDifferencesOnEveryTensor) {
  ModelDims dims{2, 32, 4, 16, 64};  // small, so every tensor has large enough gradients
  GPT model(dims);
  model.InitWeights(5);
  // GPT-2's initialisation keeps every pre-activation near 0, where GELU and softmax are nearly
  // linear and a wrong derivative of theirs hides in the tolerance. Larger weights and non-zero
  // biases and layernorm parameters move every op into its curved range.
  Rng rng(55);
  for (const TensorInfo& t : model.tensors()) {
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      float& p = model.params()[i];
      p = t.decay ? 8.0f * p : p + static_cast<float>(0.3 * rng.NextNormal());
    }
  }
  const int B = 2, T = 8;
  Batch batch = RandomBatch(B, T, dims.vocab, 6);
  model.ZeroGrad();
  model.Forward(batch.inputs.data(), batch.targets.data(), B, T);
  model.Backward(1.0f);
  std::vector<float> grads(model.grads(), model.grads() + model.num_params());
  float* p = model.params();
  auto loss_at = [&](const std::vector<std::pair<size_t, float>>& deltas) {
    for (auto [i, d] : deltas) p[i] += d;
    double loss = model.Forward(batch.inputs.data(), batch.targets.data(), B, T);
    for (auto [i, d] : deltas) p[i] -= d;
    return loss;
  };
  const double eps = 1e-2;
  for (const TensorInfo& t : model.tensors()) {
    double norm = 0;
    size_t argmax = t.offset;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      norm += double{grads[i]} * grads[i];
      if (std::fabs(grads[i]) > std::fabs(grads[argmax])) argmax = i;
    }
    norm = std::sqrt(norm);
    ASSERT_GT(norm, 1e-4) << t.name;
    // Along u = g / |g|: dL/du = |g|.
    std::vector<std::pair<size_t, float>> plus, minus;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      float u = static_cast<float>(grads[i] / norm * eps);
      plus.emplace_back(i, u);
      minus.emplace_back(i, -u);
    }
    double directional = (loss_at(plus) - loss_at(minus)) / (2 * eps);
    EXPECT_NEAR(directional, norm, 0.02 * norm) << t.name;
    // The largest single element.
    double fd = (loss_at({{argmax, static_cast<float>(eps)}}) -
                 loss_at({{argmax, static_cast<float>(-eps)}})) /
                (2 * eps);
    EXPECT_NEAR(fd, grads[argmax], 0.03 * std::fabs(grads[argmax]) + 2e-4)
        << t.name << "[" << argmax - t.offset << "]";
  }
}

}  // namespace
}  // namespace loom::train
