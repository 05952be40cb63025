// The model presets live in three tables on purpose: loomd's spec validation
// (server/jobs/model_presets), the planner's (server/planner/model_shape, which adds planning-only
// shapes) and loom-train's (worker/train/model/dims), because the training core may not depend on
// the control plane (DESIGN.md, "Layout"). This test is what keeps them one table: every preset a
// job may name has the same five dimensions in all three.
#include <string>

#include "gtest/gtest.h"
#include "server/jobs/model_presets.h"
#include "server/planner/model_shape.h"
#include "worker/train/model/dims.h"

namespace loom {
namespace {

TEST(PresetsAgreeTest, EveryJobPresetHasTheSameDimensionsInThePlannerAndInLoomTrain) {
  ASSERT_FALSE(jobs::ModelPresets().empty());
  for (const jobs::ModelPreset& p : jobs::ModelPresets()) {
    const std::string name(p.name);
    SCOPED_TRACE(name);
    const auto planned = planner::ResolvePreset(name);
    ASSERT_TRUE(planned.ok()) << planned.status();
    EXPECT_EQ(planned->layers, p.dims.layers);
    EXPECT_EQ(planned->hidden, p.dims.hidden);
    EXPECT_EQ(planned->heads, p.dims.heads);
    EXPECT_EQ(planned->seq_len, p.dims.seq_len);
    EXPECT_EQ(planned->vocab, p.dims.vocab);
    const std::optional<train::ModelDims> trained = train::PresetDims(name);
    ASSERT_TRUE(trained.has_value());
    EXPECT_EQ(trained->layers, p.dims.layers);
    EXPECT_EQ(trained->channels, p.dims.hidden);
    EXPECT_EQ(trained->heads, p.dims.heads);
    EXPECT_EQ(trained->max_seq_len, p.dims.seq_len);
    EXPECT_EQ(trained->vocab, p.dims.vocab);
  }
  // And loom-train knows no preset that loomd would refuse.
  EXPECT_EQ(std::string(train::PresetNames()), jobs::ModelPresetNames());
}

}  // namespace
}  // namespace loom
