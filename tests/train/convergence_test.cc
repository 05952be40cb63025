// `tiny` learns the built-in corpus: its validation loss falls well below the corpus's unigram
// entropy (the best loss without context) within a few hundred steps.
//
// Measured on the development machine (tiny, B=8, T=64, lr 3e-3, warmup 20, cosine to 10%,
// 300 steps): val loss 5.55 at init, 1.81 at step 100, 1.33 at step 200, 1.03 at step 300
// (seed 1337); 1.81 / 1.38 / 1.11 with seed 7. The bounds below leave a margin of about 0.3.
#include <cmath>
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/data/tiny_corpus.h"
#include "worker/train/trainer.h"

namespace loom::train {
namespace {

TEST(ConvergenceTest, TinyLearnsTheBuiltinCorpus) {
  JobConfig c = testing::TinyConfig(300);
  c.seq_len = 64;
  c.micro_batch = 8;
  c.global_batch_tokens = 8 * 64;
  c.lr = 3e-3;
  c.warmup_steps = 20;
  Dataset data = Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
  Trainer trainer(c, ResolveBatchShape(c, RankEnv{}), data);

  const double unigram = UnigramEntropy(TinyCorpusTokens());
  const float initial = trainer.Evaluate();
  std::printf("unigram entropy %.4f nats; val loss at step 0: %.4f\n", unigram, initial);
  EXPECT_NEAR(initial, std::log(256.0), 0.1);
  float val = initial;
  while (trainer.step() < c.steps) {
    trainer.Step();
    if (trainer.step() % 100 == 0) {
      val = trainer.Evaluate();
      std::printf("val loss at step %lld: %.4f\n", static_cast<long long>(trainer.step()), val);
    }
    if (trainer.step() == 100) {
      EXPECT_LT(val, unigram - 0.7);
    }
  }
  EXPECT_LT(val, 1.4f);
  EXPECT_LT(val, unigram - 1.4);
}

}  // namespace
}  // namespace loom::train
