#include "worker/train/model/padded_layout.h"

#include <algorithm>
#include <string>

#include "worker/train/error.h"

namespace loom::train {

PaddedLayout MakePaddedLayout(const std::vector<TensorInfo>& table, int vocab_multiple) {
  LOOM_CHECK(vocab_multiple >= 1, "the vocabulary multiple must be >= 1");
  LOOM_CHECK(!table.empty() && table[0].name == "wte" && table[0].offset == 0 &&
                 table[0].shape.size() == 2,
             "the padded layout needs the whole model's table, wte (V, C) first");
  const size_t V = static_cast<size_t>(table[0].shape[0]);
  const size_t C = static_cast<size_t>(table[0].shape[1]);
  LOOM_CHECK(table[0].numel == V * C, "wte must be held whole");
  const size_t m = static_cast<size_t>(vocab_multiple);
  const size_t Vp = (V + m - 1) / m * m;
  const size_t pad = (Vp - V) * C;
  PaddedLayout layout;
  layout.padded_vocab = static_cast<int>(Vp);
  layout.offset.resize(table.size());
  layout.numel.resize(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    layout.offset[i] = table[i].offset + (i == 0 ? 0 : pad);
    layout.numel[i] = table[i].numel + (i == 0 ? pad : 0);
  }
  layout.total = ParamCount(table) + pad;
  return layout;
}

void ForEachDeviceSpan(const PaddedLayout& layout, const std::vector<TensorInfo>& table, size_t lo,
                       size_t hi, const std::function<void(int, size_t, size_t, size_t)>& fn) {
  LOOM_CHECK(layout.offset.size() == table.size(), "the layout is not the table's");
  for (size_t i = 0; i < table.size() && lo < hi; ++i) {
    const TensorInfo& t = table[i];
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a >= b) continue;  // outside the range, or not held (numel 0)
    // wte's padding rows follow its V real rows: the first numel elements map one to one.
    fn(static_cast<int>(i), layout.offset[i] + (a - t.offset), a, b - a);
  }
}

}  // namespace loom::train
