// The GPU model's padded parameter layout (model/padded_layout.h): where each tensor sits, and
// how a table range maps onto it around the padding rows.
#include "worker/train/model/padded_layout.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/params.h"

namespace loom::train {
namespace {

TEST(PaddedLayoutTest, WtePaddedToTheMultipleEveryOtherTensorShifted) {
  const ModelDims dims{2, 8, 2, 16, 50};  // V = 50 -> Vp = 64 with a multiple of 64
  const std::vector<TensorInfo> table = ParamTable(dims);
  const PaddedLayout layout = MakePaddedLayout(table, 64);
  EXPECT_EQ(layout.padded_vocab, 64);
  const size_t pad = (64 - 50) * 8;
  EXPECT_EQ(layout.total, ParamCount(table) + pad);
  EXPECT_EQ(layout.offset[0], 0u);
  EXPECT_EQ(layout.numel[0], 64u * 8);
  for (size_t i = 1; i < table.size(); ++i) {
    EXPECT_EQ(layout.offset[i], table[i].offset + pad) << table[i].name;
    EXPECT_EQ(layout.numel[i], table[i].numel) << table[i].name;
  }
  // A vocabulary already a multiple has no padding.
  const PaddedLayout none = MakePaddedLayout(ParamTable(ModelDims{1, 8, 2, 16, 128}), 64);
  EXPECT_EQ(none.padded_vocab, 128);
  EXPECT_EQ(none.total, ParamCount(ParamTable(ModelDims{1, 8, 2, 16, 128})));
}

// The spans of a range tile it exactly, each at its tensor's device place; the padding rows of
// wte are in none of them.
TEST(PaddedLayoutTest, SpansMapATableRangeAroundThePadding) {
  const ModelDims dims{3, 16, 4, 32, 257};  // GPT-2-like odd vocabulary
  const std::vector<TensorInfo> table = ParamTable(dims);
  const PaddedLayout layout = MakePaddedLayout(table, 64);
  ASSERT_EQ(layout.padded_vocab, 320);
  const size_t V = 257, C = 16, n = ParamCount(table);
  std::vector<float> host(n);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.5f + static_cast<float>(i);
  // Whole table, then ranges that start and end inside tensors and across wte's end.
  for (auto [lo, hi] : std::vector<std::pair<size_t, size_t>>{
           {0, n}, {V * C - 5, V * C + 7}, {100, 101}, {n - 3, n + 50}, {n, n}}) {
    SCOPED_TRACE(std::to_string(lo) + ".." + std::to_string(hi));
    std::vector<float> padded(layout.total, -1.0f);  // poisoned
    size_t next = lo, covered = 0;
    ForEachDeviceSpan(layout, table, lo, hi, [&](int i, size_t dev, size_t at, size_t count) {
      EXPECT_EQ(at, next);  // in order, without gaps
      EXPECT_EQ(dev, layout.offset[i] + (at - table[i].offset));
      for (size_t k = 0; k < count; ++k) padded[dev + k] = host[at + k];
      next = at + count;
      covered += count;
    });
    EXPECT_EQ(covered, std::min(hi, n) - std::min(lo, n));
    for (size_t e = V * C; e < 320 * C; ++e) ASSERT_EQ(padded[e], -1.0f) << "padding row " << e;
  }
  // The whole table's spans reproduce every element at its place, shifted past the padding.
  std::vector<float> padded(layout.total, 0.0f);
  ForEachDeviceSpan(layout, table, 0, n, [&](int, size_t dev, size_t at, size_t count) {
    std::copy(host.begin() + at, host.begin() + at + count, padded.begin() + dev);
  });
  EXPECT_EQ(padded[layout.offset.back()], host[table.back().offset]);
  EXPECT_EQ(padded[V * C - 1], host[V * C - 1]);
  EXPECT_EQ(padded[320 * C], host[V * C]);  // wpe's first element, after the padding
}

}  // namespace
}  // namespace loom::train
