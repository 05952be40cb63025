// Boxes of row-major tensors, and the copies between them that let a checkpoint written under
// one parallel layout load under another (DESIGN.md, "the invariance principle").
//
// Every tensor of the model is seen through its "view" (TensorInfo::view_shape). A rank holds a
// box of it, [start, start + size) per dimension, stored densely in row-major order of the box;
// a checkpoint shard stores boxes the same way. Loading copies, for each box a rank needs, the
// intersection with every stored box, run by contiguous run; no whole tensor is ever assembled.
//
// Pure functions: no I/O and no shared state, safe from any thread.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_RESHARD_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_RESHARD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

// A box of a row-major tensor view: elements [start[d], start[d] + size[d]) in each dimension d.
// start and size have the view's rank.
struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> size;

  bool operator==(const Box&) const = default;
};

// The whole view `shape` as a box.
Box FullBox(const std::vector<int64_t>& shape);

// The number of elements of `box` (1 for rank 0, 0 when any size is 0).
int64_t Volume(const Box& box);

// The common part of `a` and `b` (same rank), or nullopt when it is empty.
std::optional<Box> Intersect(const Box& a, const Box& b);

// True when `inner` lies inside `outer` (same rank).
bool Contains(const Box& outer, const Box& inner);

// "[0:2, 0:3, 32:64, 0:64]" (half-open ranges per dimension), for messages.
std::string BoxString(const Box& box);

// Calls fn(src_offset, dst_offset, count) once for each maximal contiguous run of the elements
// of `region`, which must lie inside both `src` and `dst`. Offsets count elements from the start
// of the box's row-major data. Runs arrive in increasing order of both offsets. Dimensions that
// `region`, `src` and `dst` all span completely are merged into one run.
void ForEachRun(
    const Box& region, const Box& src, const Box& dst,
    const std::function<void(int64_t src_offset, int64_t dst_offset, int64_t count)>& fn);

// Copies the intersection of `src_box` and `dst_box` from `src` (the row-major data of
// src_box) into `dst` (that of dst_box); the rest of dst is untouched. Returns the number of
// elements copied (0 when the boxes do not meet).
int64_t CopyIntersection(const Box& src_box, const float* src, const Box& dst_box, float* dst);

// A contiguous range of a box's row-major data as boxes: returns (sub-box, offset of its first
// element in the box's data) for the elements [lo, hi) of `box`, in order, at most
// 2 * rank - 1 of them. Each sub-box's own row-major data is the matching contiguous part of
// the box's data (this is how a ZeRO-1 range of a flat buffer becomes boxes). Requires
// 0 <= lo <= hi <= Volume(box); empty for lo == hi.
std::vector<std::pair<Box, int64_t>> SplitFlatRange(const Box& box, int64_t lo, int64_t hi);

// Whether `pieces` tile `target` exactly: every element of target lies in exactly one piece
// (pieces may extend beyond target; only their parts inside it count).
struct Coverage {
  enum class Kind { kExact, kOverlap, kGap };
  Kind kind = Kind::kExact;
  int first = -1;  // kOverlap: the indices of two overlapping pieces
  int second = -1;
  Box region;  // kOverlap: their common part inside target; kGap: an uncovered box
};

// Checks how `pieces` cover `target`. A gap is reported as one box of elements that no piece
// holds (a cell of the grid that the pieces' edges cut target into; when that grid is too large
// to search, the whole target).
Coverage CheckCoverage(const Box& target, const std::vector<Box>& pieces);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_RESHARD_H_
