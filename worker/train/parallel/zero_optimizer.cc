#include "worker/train/parallel/zero_optimizer.h"

#include <algorithm>

#include "worker/train/error.h"

namespace loom::train {

ZeroRange ZeroRangeOf(size_t n, int size, int rank) {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size, "ZeRO range of a rank outside the group");
  ZeroRange r;
  r.shard = (n + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
  r.begin = std::min(n, r.shard * static_cast<size_t>(rank));
  r.end = std::min(n, r.begin + r.shard);
  return r;
}

RangeGather::RangeGather(size_t n, Communicator* dp)
    : n_(n), dp_(dp), range_(ZeroRangeOf(n, dp->size(), dp->rank())) {
  in_.assign(range_.shard, 0.0f);
  out_.assign(range_.shard * static_cast<size_t>(dp->size()), 0.0f);
}

void RangeGather::ReduceScatter(float* grads, float scale) {
  const size_t padded_n = range_.shard * static_cast<size_t>(dp_->size());
  const float* in = grads;
  if (padded_n != n_) {
    // The last blocks reach past n: reduce-scatter a copy with a zero tail (zeros add nothing,
    // and the tail falls outside every range).
    padded_.resize(padded_n, 0.0f);
    std::copy_n(grads, n_, padded_.begin());
    in = padded_.data();
  }
  dp_->ReduceScatterSum(in, in_.data(), range_.shard)->Wait();
  float* mine = grads + range_.begin;
  for (size_t i = 0; i < range_.end - range_.begin; ++i) mine[i] = in_[i] * scale;
}

void RangeGather::Gather(const float* mine, float* full) {
  std::copy_n(mine, range_.end - range_.begin, in_.begin());
  dp_->AllGather(in_.data(), out_.data(), range_.shard)->Wait();
  // Rank r's padded block starts at r * shard, where its range starts: one copy of n floats.
  std::copy_n(out_.begin(), n_, full);
}

}  // namespace loom::train
