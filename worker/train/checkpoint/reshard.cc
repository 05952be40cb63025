#include "worker/train/checkpoint/reshard.h"

#include <algorithm>
#include <cstring>

#include "worker/train/error.h"

namespace loom::train {
namespace {

// Row-major strides of a box's dense data.
std::vector<int64_t> Strides(const Box& box) {
  std::vector<int64_t> strides(box.size.size(), 1);
  for (size_t d = box.size.size(); d-- > 1;) strides[d - 1] = strides[d] * box.size[d];
  return strides;
}

// The gap search gives up (and reports the whole target) beyond this many cell x piece tests.
constexpr int64_t kMaxGapWork = int64_t{1} << 24;

}  // namespace

Box FullBox(const std::vector<int64_t>& shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape};
}

int64_t Volume(const Box& box) {
  int64_t n = 1;
  for (int64_t s : box.size) n *= s;
  return n;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  LOOM_CHECK(a.start.size() == b.start.size(), "intersecting boxes of different ranks");
  Box out;
  for (size_t d = 0; d < a.start.size(); ++d) {
    const int64_t lo = std::max(a.start[d], b.start[d]);
    const int64_t hi = std::min(a.start[d] + a.size[d], b.start[d] + b.size[d]);
    if (hi <= lo) return std::nullopt;
    out.start.push_back(lo);
    out.size.push_back(hi - lo);
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.start.size() != inner.start.size()) return false;
  for (size_t d = 0; d < outer.start.size(); ++d) {
    if (inner.start[d] < outer.start[d] ||
        inner.start[d] + inner.size[d] > outer.start[d] + outer.size[d]) {
      return false;
    }
  }
  return true;
}

std::string BoxString(const Box& box) {
  std::string s = "[";
  for (size_t d = 0; d < box.start.size(); ++d) {
    s += (d ? ", " : "") + std::to_string(box.start[d]) + ":" +
         std::to_string(box.start[d] + box.size[d]);
  }
  return s + "]";
}

void ForEachRun(const Box& region, const Box& src, const Box& dst,
                const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  LOOM_CHECK(Contains(src, region) && Contains(dst, region), "ForEachRun: region outside a box");
  if (Volume(region) == 0) return;
  const size_t n = region.size.size();
  if (n == 0) {
    fn(0, 0, 1);
    return;
  }
  // The run spans dimensions [k, n): those after k are spanned completely by all three boxes, so
  // consecutive rows of the region are consecutive in both src and dst.
  size_t k = n - 1;
  int64_t run = region.size[k];
  while (k > 0 && region.size[k] == src.size[k] && region.size[k] == dst.size[k]) {
    --k;
    run *= region.size[k];
  }
  const std::vector<int64_t> src_strides = Strides(src);
  const std::vector<int64_t> dst_strides = Strides(dst);
  std::vector<int64_t> index(k, 0);  // over the region's outer dimensions [0, k)
  while (true) {
    int64_t src_offset = 0, dst_offset = 0;
    for (size_t d = 0; d < n; ++d) {
      const int64_t at = region.start[d] + (d < k ? index[d] : 0);
      src_offset += (at - src.start[d]) * src_strides[d];
      dst_offset += (at - dst.start[d]) * dst_strides[d];
    }
    fn(src_offset, dst_offset, run);
    // Next outer index, row-major.
    size_t d = k;
    while (d > 0) {
      --d;
      if (++index[d] < region.size[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

int64_t CopyIntersection(const Box& src_box, const float* src, const Box& dst_box, float* dst) {
  std::optional<Box> region = Intersect(src_box, dst_box);
  if (!region) return 0;
  ForEachRun(*region, src_box, dst_box, [&](int64_t s, int64_t d, int64_t count) {
    std::memcpy(dst + d, src + s, static_cast<size_t>(count) * sizeof(float));
  });
  return Volume(*region);
}

namespace {

// SplitFlatRange below dimension `d`: `fixed` holds the absolute indices of dimensions < d; the
// range [lo, hi) counts elements of the sub-box spanned by dimensions >= d; `base` is the offset
// of that sub-box's first element in the box's data.
void SplitBelow(const Box& box, size_t d, std::vector<int64_t>* fixed, int64_t lo, int64_t hi,
                int64_t base, std::vector<std::pair<Box, int64_t>>* out) {
  const size_t n = box.size.size();
  int64_t inner = 1;  // elements per index of dimension d
  for (size_t e = d + 1; e < n; ++e) inner *= box.size[e];
  // The sub-box of rows [first, last) of dimension d, whole below it.
  auto emit = [&](int64_t first, int64_t last) {
    Box b;
    for (size_t e = 0; e < n; ++e) {
      if (e < d) {
        b.start.push_back((*fixed)[e]);
        b.size.push_back(1);
      } else if (e == d) {
        b.start.push_back(box.start[d] + first);
        b.size.push_back(last - first);
      } else {
        b.start.push_back(box.start[e]);
        b.size.push_back(box.size[e]);
      }
    }
    out->emplace_back(std::move(b), base + first * inner);
  };
  int64_t first = lo / inner;
  const int64_t last = hi / inner;
  if (lo % inner != 0) {  // a partial leading row
    fixed->push_back(box.start[d] + first);
    const int64_t end = first == last ? hi - first * inner : inner;
    SplitBelow(box, d + 1, fixed, lo - first * inner, end, base + first * inner, out);
    fixed->pop_back();
    if (first == last) return;
    ++first;
  }
  if (last > first) emit(first, last);
  if (hi % inner != 0 && last >= first) {  // a partial trailing row
    fixed->push_back(box.start[d] + last);
    SplitBelow(box, d + 1, fixed, 0, hi - last * inner, base + last * inner, out);
    fixed->pop_back();
  }
}

}  // namespace

std::vector<std::pair<Box, int64_t>> SplitFlatRange(const Box& box, int64_t lo, int64_t hi) {
  LOOM_CHECK(0 <= lo && lo <= hi && hi <= Volume(box), "SplitFlatRange: range outside the box");
  std::vector<std::pair<Box, int64_t>> out;
  if (lo == hi) return out;
  if (box.size.empty()) {
    out.emplace_back(box, 0);
    return out;
  }
  std::vector<int64_t> fixed;
  SplitBelow(box, 0, &fixed, lo, hi, 0, &out);
  return out;
}

Coverage CheckCoverage(const Box& target, const std::vector<Box>& pieces) {
  Coverage out;
  if (Volume(target) == 0) return out;
  std::vector<std::optional<Box>> inside;
  for (const Box& p : pieces) inside.push_back(Intersect(p, target));
  int64_t covered = 0;
  for (size_t i = 0; i < inside.size(); ++i) {
    if (!inside[i]) continue;
    covered += Volume(*inside[i]);
    for (size_t j = 0; j < i; ++j) {
      if (!inside[j]) continue;
      if (std::optional<Box> both = Intersect(*inside[i], *inside[j])) {
        out.kind = Coverage::Kind::kOverlap;
        out.first = static_cast<int>(j);
        out.second = static_cast<int>(i);
        out.region = *both;
        return out;
      }
    }
  }
  // Disjoint pieces inside the target: they tile it exactly when their volumes add up.
  if (covered == Volume(target)) return out;
  out.kind = Coverage::Kind::kGap;
  out.region = target;
  // Cut the target along every piece edge: each cell of that grid is inside a piece or outside
  // all of them, so the first cell outside all of them is a gap to name.
  const size_t n = target.size.size();
  std::vector<std::vector<int64_t>> cuts(n);
  int64_t cells = 1;
  for (size_t d = 0; d < n; ++d) {
    cuts[d] = {target.start[d], target.start[d] + target.size[d]};
    for (const std::optional<Box>& p : inside) {
      if (!p) continue;
      cuts[d].push_back(p->start[d]);
      cuts[d].push_back(p->start[d] + p->size[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    cells *= static_cast<int64_t>(cuts[d].size() - 1);
    if (cells * static_cast<int64_t>(pieces.size() + 1) > kMaxGapWork) return out;
  }
  std::vector<size_t> cell(n, 0);
  while (true) {
    Box box;
    for (size_t d = 0; d < n; ++d) {
      box.start.push_back(cuts[d][cell[d]]);
      box.size.push_back(cuts[d][cell[d] + 1] - cuts[d][cell[d]]);
    }
    bool held = false;
    for (const std::optional<Box>& p : inside) held = held || (p && Contains(*p, box));
    if (!held) {
      out.region = box;
      return out;
    }
    size_t d = n;
    while (d > 0) {
      --d;
      if (++cell[d] + 1 < cuts[d].size()) break;
      cell[d] = 0;
      if (d == 0) return out;  // unreachable: the volumes said a gap exists
    }
    if (n == 0) return out;
  }
}

}  // namespace loom::train
