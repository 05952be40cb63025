// ZeRO-1 (DESIGN.md, "DP"): the optimizer state is sharded across the data-parallel ranks.
// Each dp rank owns one contiguous range of the stage's flat parameter buffer (AdamW's
// [begin, end)) and keeps m and v for it alone. A step reduce-scatters the gradients so that
// each rank receives the sum of its range only, updates that range of the parameters, and then
// the ranges are all-gathered so every rank holds every parameter again.
//
// Traffic: a ring reduce-scatter plus a ring all-gather move as many bytes as one ring
// all-reduce of the gradients, so ZeRO-1 costs what plain data parallelism costs (the earlier
// all-reduce + all-gather cost 1.5 times that). Memory: 2 * num_params / dp floats of optimizer
// state per rank instead of 2 * num_params. The price: the reduce-scatter starts after the
// whole backward (no bucketed overlap under ZeRO-1).
//
// The ranges tile a buffer padded to dp * shard floats (ZeroRangeOf): rank r's padded block
// [r * shard, (r + 1) * shard) is both its reduce-scatter block and its all-gather block, and
// its range is that block clipped to n, so the two collectives and AdamW agree on who owns what.
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

// The dp collectives of ZeRO-1 over `dp` (outlives this): the gradients' reduce-scatter into
// this rank's range and the ranges' all-gather.
// Threading: the training thread; each call blocks until its collective completed.
class RangeGather {
 public:
  RangeGather(size_t n, Communicator* dp);

  // full[r's range] := rank r's `mine` (its range's length in floats), for every rank r, over
  // full (n). `mine` may point into `full` (the parameters). Throws CommError.
  void Gather(const float* mine, float* full);

  // range(grads) := sum over dp ranks of their grads in this rank's range, times `scale`,
  // written to grads[range] (n floats; the rest of grads is left as it was). Throws CommError.
  void ReduceScatter(float* grads, float scale);

  const ZeroRange& range() const { return range_; }
  // Bytes reduce-scattered per call: the padded input this rank hands in (dp * shard floats),
  // the size an all-reduce of the same gradients is counted at.
  size_t reduce_scatter_bytes() const { return range_.shard * sizeof(float) * dp_->size(); }
  // Bytes all-gathered per call (what this rank receives and sends, padded).
  size_t bytes_per_call() const { return range_.shard * sizeof(float) * dp_->size(); }

 private:
  size_t n_;
  Communicator* dp_;
  ZeroRange range_;
  std::vector<float> in_;      // (shard)
  std::vector<float> out_;     // (size * shard)
  std::vector<float> padded_;  // (size * shard): the gradients with a zero tail, when n < that
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PARALLEL_ZERO_OPTIMIZER_H_
