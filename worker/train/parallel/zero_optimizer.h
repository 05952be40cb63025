// ZeRO-1 (DESIGN.md, "DP"): the optimizer state is sharded across the data-parallel ranks.
// Each dp rank owns one contiguous range of the stage's flat parameter buffer (AdamW's
// [begin, end)), keeps m and v for it alone, updates that range of the parameters from the
// averaged gradients, and then the ranges are all-gathered so every rank holds every parameter
// again.
//
// The gradients are still averaged by the bucketed all-reduce (parallel/grad_buckets.h), which
// overlaps backward; a rank then reads only its range. A reduce-scatter would move half the
// bytes but could not start before the whole backward is done with this bucketing. What ZeRO-1
// saves here is optimizer memory: 2 * num_params / dp floats per rank instead of 2 * num_params.
#ifndef LOOM_WORKER_TRAIN_PARALLEL_ZERO_OPTIMIZER_H_
#define LOOM_WORKER_TRAIN_PARALLEL_ZERO_OPTIMIZER_H_

#include <cstddef>
#include <vector>

#include "worker/train/comm/communicator.h"

namespace loom::train {

// Rank r's range: shard = ceil(n / size) floats from r * shard, clipped to n (the last ranks'
// ranges may be shorter or empty).
struct ZeroRange {
  size_t begin = 0;
  size_t end = 0;
  size_t shard = 0;  // the padded length every rank contributes to an all-gather
};
ZeroRange ZeroRangeOf(size_t n, int size, int rank);

// Gathers every dp rank's range into a full buffer over `dp` (outlives this).
// Threading: the training thread; each call blocks until its all-gather completed.
class RangeGather {
 public:
  RangeGather(size_t n, Communicator* dp);

  // full[r's range] := rank r's `mine` (its range's length in floats), for every rank r, over
  // full (n). `mine` may point into `full` (the parameters). Throws CommError.
  void Gather(const float* mine, float* full);

  const ZeroRange& range() const { return range_; }
  // Bytes all-gathered per call (what this rank receives and sends, padded).
  size_t bytes_per_call() const { return range_.shard * sizeof(float) * dp_->size(); }

 private:
  size_t n_;
  Communicator* dp_;
  ZeroRange range_;
  std::vector<float> in_;   // (shard)
  std::vector<float> out_;  // (size * shard)
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PARALLEL_ZERO_OPTIMIZER_H_
