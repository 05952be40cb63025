#include "server/planner/model_shape.h"

#include <gtest/gtest.h>

namespace loom::planner {
namespace {

// docs/rank-contract.md, "Model presets".
TEST(ModelShapeTest, PresetsMatchTheRankContract) {
  struct Row {
    const char* name;
    int L, C, NH, T, V;
  };
  for (const Row& r :
       {Row{"tiny", 2, 64, 4, 64, 256}, Row{"small", 6, 384, 6, 256, 50257},
        Row{"gpt2-124m", 12, 768, 12, 1024, 50257}, Row{"gpt2-350m", 24, 1024, 16, 1024, 50257},
        Row{"gpt2-774m", 36, 1280, 20, 1024, 50257}, Row{"gpt2-1.5b", 48, 1600, 25, 1024, 50257}}) {
    absl::StatusOr<ModelShape> m = ResolvePreset(r.name);
    ASSERT_TRUE(m.ok()) << r.name;
    EXPECT_EQ(m->layers, r.L);
    EXPECT_EQ(m->hidden, r.C);
    EXPECT_EQ(m->heads, r.NH);
    EXPECT_EQ(m->seq_len, r.T);
    EXPECT_EQ(m->vocab, r.V);
  }
  absl::StatusOr<ModelShape> bad = ResolvePreset("gpt5");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("gpt2-124m"), absl::string_view::npos);
}

TEST(ModelShapeTest, ParameterCounts) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  EXPECT_DOUBLE_EQ(BlockParams(m, 1), 7'087'872);  // 12h² + 13h
  EXPECT_DOUBLE_EQ(TotalParams(m), 124'439'808);   // the published GPT-2 small count
  // tp = 4: 12h²/4 + 7h/4 + 6h.
  EXPECT_DOUBLE_EQ(BlockParams(m, 4), 1'769'472 + 1'344 + 4'608);
  EXPECT_DOUBLE_EQ(HeadParams(m, 1, 1), 1'536);
  EXPECT_DOUBLE_EQ(HeadParams(m, 1, 2), 1'536 + 38'597'376);
  // 6·(12·L·h² + V·h) + 6·L·h·s.
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m), 797'815'296);
  // GPT-3: about 175 billion.
  EXPECT_NEAR(TotalParams(*ResolvePreset("gpt3-175b")) / 1e9, 175, 1);
}

TEST(ModelShapeTest, ValidationNamesFieldAndAlternative) {
  ModelShape m{"custom", 12, 1000, 12, 1024, 50257};
  absl::Status s = ValidateModel(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.hidden 1000"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("996 or 1008"), absl::string_view::npos) << s;
  m.hidden = 768;
  m.layers = 0;
  EXPECT_NE(ValidateModel(m).message().find("model.layers"), absl::string_view::npos);
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16);
  EXPECT_FALSE(ParsePrecision("fp16").ok());
}

}  // namespace
}  // namespace loom::planner
