#include "worker/train/data/dataset.h"

#include <algorithm>

#include "worker/train/data/tiny_corpus.h"
#include "worker/train/error.h"
#include "worker/train/rng.h"

namespace loom::train {

Dataset Dataset::Load(const std::string& path, const std::string& builtin,
                      const std::string& val_path, int vocab, int seq_len) {
  TokenStream train = [&] {
    if (!builtin.empty()) {
      if (builtin != "tiny-corpus") {
        throw BadInput("data.builtin", "unknown corpus \"" + builtin + "\" (expected tiny-corpus)");
      }
      if (vocab < 256) {
        throw BadInput("model.vocab", "tiny-corpus is byte-level and needs vocab >= 256, got " +
                                          std::to_string(vocab));
      }
      return TokenStream::FromTokens(TinyCorpusTokens(), "tiny-corpus");
    }
    return TokenStream::Open(path, vocab);
  }();
  TokenStream val =
      val_path.empty() ? TokenStream::FromTokens({}, "") : TokenStream::Open(val_path, vocab);
  Dataset d(std::move(train), std::move(val));
  const size_t need = static_cast<size_t>(seq_len) + 1;
  const TokenStream& t = d.train_stream_;
  if (val_path.empty()) {
    const size_t val_size = t.size() / 10;
    d.train_ = {t.data(), t.size() - val_size};
    d.val_ = {t.data() + (t.size() - val_size), val_size};
    if (d.train_.size < need || d.val_.size < need) {
      throw BadInput(t.name(), std::to_string(t.size()) +
                                   " tokens are too few: training (90%) "
                                   "and validation (10%) each need seq_len + 1 = " +
                                   std::to_string(need) + " tokens");
    }
  } else {
    d.train_ = {t.data(), t.size()};
    d.val_ = {d.val_stream_.data(), d.val_stream_.size()};
    if (d.train_.size < need) {
      throw BadInput(t.name(), std::to_string(t.size()) +
                                   " tokens are too few, expected at "
                                   "least seq_len + 1 = " +
                                   std::to_string(need));
    }
    if (d.val_.size < need) {
      throw BadInput(val_path, std::to_string(d.val_.size) +
                                   " tokens are too few, expected at "
                                   "least seq_len + 1 = " +
                                   std::to_string(need));
    }
  }
  return d;
}

BatchSampler::BatchSampler(TokenRange tokens, uint64_t seed, int B, int T, int K, int dp_rank)
    : tokens_(tokens), seed_(seed), B_(B), T_(T), K_(K), dp_rank_(dp_rank) {
  LOOM_CHECK(tokens.size >= static_cast<size_t>(T) + 1, "token range shorter than T + 1");
}

void BatchSampler::Fill(int64_t step, int micro, int* inputs, int* targets) const {
  const uint64_t starts = tokens_.size - static_cast<size_t>(T_);  // valid starts: [0, n - T)
  for (int b = 0; b < B_; ++b) {
    const uint64_t j = (static_cast<uint64_t>(dp_rank_) * K_ + micro) * B_ + b;
    const uint64_t start = HashTuple(seed_, 0xda7a, static_cast<uint64_t>(step), j) % starts;
    const uint16_t* seq = tokens_.data + start;  // T + 1 tokens
    for (int t = 0; t < T_; ++t) {
      inputs[b * T_ + t] = seq[t];
      targets[b * T_ + t] = seq[t + 1];
    }
  }
}

EvalBatches::EvalBatches(TokenRange tokens, int B, int T, int max_batches)
    : tokens_(tokens), B_(B), T_(T) {
  LOOM_CHECK(tokens.size >= static_cast<size_t>(T) + 1, "validation range shorter than T + 1");
  num_windows_ = (tokens.size - 1) / T;
  const size_t batches = (num_windows_ + B - 1) / B;
  num_batches_ = static_cast<int>(std::min<size_t>(batches, std::max(1, max_batches)));
}

void EvalBatches::Fill(int index, int* inputs, int* targets) const {
  for (int b = 0; b < B_; ++b) {
    const size_t window = (static_cast<size_t>(index) * B_ + b) % num_windows_;
    const uint16_t* seq = tokens_.data + window * T_;
    for (int t = 0; t < T_; ++t) {
      inputs[b * T_ + t] = seq[t];
      targets[b * T_ + t] = seq[t + 1];
    }
  }
}

}  // namespace loom::train
