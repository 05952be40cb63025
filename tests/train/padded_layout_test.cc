// The GPU model's padded parameter layout (model/padded_layout.h): where each tensor sits, and
// that padding and unpadding are exact inverses with zero padding rows.
#include "worker/train/model/padded_layout.h"

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

TEST(PaddedLayoutTest, PadThenUnpadIsTheIdentityAndThePaddingIsZero) {
  const ModelDims dims{3, 16, 4, 32, 257};  // GPT-2-like odd vocabulary
  const std::vector<TensorInfo> table = ParamTable(dims);
  const PaddedLayout layout = MakePaddedLayout(table, 64);
  ASSERT_EQ(layout.padded_vocab, 320);
  std::vector<float> host(ParamCount(table));
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.5f + static_cast<float>(i);
  std::vector<float> padded(layout.total, -1.0f);  // poisoned: every element must be written
  PadToDevice(layout, table, host.data(), padded.data());
  const size_t V = 257, C = 16;
  for (size_t e = V * C; e < 320 * C; ++e) ASSERT_EQ(padded[e], 0.0f) << e;
  for (float x : padded) ASSERT_NE(x, -1.0f);
  // The first element of lnfb (the last tensor) is the host's, shifted by the padding.
  EXPECT_EQ(padded[layout.offset.back()], host[table.back().offset]);
  std::vector<float> back(host.size(), -1.0f);
  UnpadFromDevice(layout, table, padded.data(), back.data());
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace loom::train
