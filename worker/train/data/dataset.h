// Training and validation tokens, and the deterministic choice of the sequences of each step.
#ifndef LOOM_WORKER_TRAIN_DATA_DATASET_H_
#define LOOM_WORKER_TRAIN_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/train/data/token_file.h"

namespace loom::train {

// A contiguous range of a token stream.
struct TokenRange {
  const uint16_t* data = nullptr;
  size_t size = 0;
};

// The training and validation tokens of a job. Validation is a separate file (val_path) or,
// without one, the last 10% of the training stream, which training then does not use.
class Dataset {
 public:
  // Loads the data of a job: exactly one of `path` (a token file) and `builtin`
  // ("tiny-corpus"); `val_path` optional. Both ranges must hold at least seq_len + 1 tokens.
  // Throws InputError naming the file (or "data.builtin") and what was expected.
  static Dataset Load(const std::string& path, const std::string& builtin,
                      const std::string& val_path, int vocab, int seq_len);

  TokenRange train() const { return train_; }
  TokenRange val() const { return val_; }
  size_t bytes_owned() const { return train_stream_.bytes_owned() + val_stream_.bytes_owned(); }

 private:
  Dataset(TokenStream train, TokenStream val)
      : train_stream_(std::move(train)), val_stream_(std::move(val)) {}
  TokenStream train_stream_;
  TokenStream val_stream_;  // empty when validation is the tail of train_stream_
  TokenRange train_;
  TokenRange val_;
};

// Chooses the training sequences. A step's global batch is a list of `tokens_per_step / T`
// sequences; sequence j of step s starts at Hash(seed, s, j) mod (n - T), and rank r's
// micro-batch k holds sequences j = (r * K + k) * B + b for b < B. The choice is a pure function
// of (seed, step, data-parallel rank, micro-batch): nothing to save for resume, and the same
// global batch under every layout with the same global batch size.
class BatchSampler {
 public:
  BatchSampler(TokenRange tokens, uint64_t seed, int B, int T, int K, int dp_rank);

  // Writes micro-batch `micro` of optimizer step `step` (0-based): inputs (B, T) and targets
  // (B, T), the targets being the inputs shifted by one token.
  void Fill(int64_t step, int micro, int* inputs, int* targets) const;

 private:
  TokenRange tokens_;
  uint64_t seed_;
  int B_, T_, K_, dp_rank_;
};

// The fixed validation batches: consecutive windows of T + 1 tokens (overlapping by one) from
// the start of the validation range, B per batch, at most `max_batches` batches; windows repeat
// cyclically when the range holds fewer than B.
class EvalBatches {
 public:
  EvalBatches(TokenRange tokens, int B, int T, int max_batches);
  int num_batches() const { return num_batches_; }
  // Writes batch `index` in [0, num_batches()).
  void Fill(int index, int* inputs, int* targets) const;

 private:
  TokenRange tokens_;
  int B_, T_;
  size_t num_windows_;
  int num_batches_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DATA_DATASET_H_
