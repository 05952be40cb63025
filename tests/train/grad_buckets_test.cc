// The gradient bucket plan shared by the CPU (parallel/grad_buckets.h) and the GPU
// (cuda_grad_sync.h): the pieces cover the table exactly once, come in backward order, respect
// the bucket size; and the same buckets over the GPU model's padded layout (wte with its padding
// rows) cover the device buffer exactly once. Host only: runs on every machine.
#include "worker/train/parallel/grad_buckets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "worker/train/model/dims.h"
#include "worker/train/model/padded_layout.h"
#include "worker/train/model/params.h"

namespace loom::train {
namespace {

// A model whose vocabulary is not a multiple of 64, so wte gets padding rows on the GPU.
ModelDims SmallDims() { return ModelDims{3, 32, 4, 16, 100}; }

const TensorInfo& Find(const std::vector<TensorInfo>& table, const char* name) {
  for (const TensorInfo& t : table) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return table.front();
}

// How many times each element of a buffer of `n` elements is covered by the buckets' pieces.
std::vector<int> Coverage(const std::vector<GradBucketPlan>& buckets, size_t n) {
  std::vector<int> hits(n, 0);
  for (const GradBucketPlan& b : buckets) {
    for (const GradPiece& p : b.pieces) {
      EXPECT_LE(p.offset + p.numel, n);
      for (size_t i = p.offset; i < std::min(n, p.offset + p.numel); ++i) ++hits[i];
    }
  }
  return hits;
}

TEST(GradBucketPlanTest, PiecesCoverTheTableOnceInBackwardOrder) {
  const ModelDims dims = SmallDims();
  const std::vector<TensorInfo> table = ParamTable(dims);
  const size_t total = ParamCount(table);
  for (size_t bucket_bytes : {size_t{4}, size_t{4096}, size_t{1} << 30}) {
    SCOPED_TRACE(bucket_bytes);
    const std::vector<GradBucketPlan> buckets =
        PlanGradBuckets(table, dims.layers, bucket_bytes, sizeof(float));
    const std::vector<int> hits = Coverage(buckets, total);
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    // Stages go down along the pieces: L (the final layernorm), blocks L-1 .. 0, then -1.
    std::vector<GradPiece> all;
    for (const GradBucketPlan& b : buckets) {
      size_t numel = 0;
      for (const GradPiece& p : b.pieces) numel += p.numel;
      EXPECT_EQ(b.numel, numel);
      ASSERT_FALSE(b.pieces.empty());
      EXPECT_EQ(b.last_stage, b.pieces.back().stage);
      // At most the bucket size, unless one piece is larger than it on its own.
      if (b.pieces.size() > 1) {
        EXPECT_LE(b.numel * sizeof(float), bucket_bytes);
      }
      all.insert(all.end(), b.pieces.begin(), b.pieces.end());
    }
    for (size_t i = 1; i < all.size(); ++i) EXPECT_LE(all[i].stage, all[i - 1].stage);
    ASSERT_GE(all.size(), 4u);
    EXPECT_EQ(all.front().offset, Find(table, "lnfb").offset);
    EXPECT_EQ(all.front().stage, dims.layers);
    EXPECT_EQ(all[2].offset, Find(table, "fcprojb").offset + (dims.layers - 1) * dims.channels);
    EXPECT_EQ(all[2].stage, dims.layers - 1);
    EXPECT_EQ(all.back().offset, Find(table, "wte").offset);
    EXPECT_EQ(all.back().numel, Find(table, "wte").numel);
    EXPECT_EQ(all.back().stage, -1);
    // Greedy packing: a bucket is cut only when the next piece would not fit.
    for (size_t i = 1; i < buckets.size(); ++i) {
      EXPECT_GT((buckets[i - 1].numel + buckets[i].pieces.front().numel) * sizeof(float),
                bucket_bytes);
    }
  }
  // One huge bucket holds everything; one-element buckets give one piece each.
  EXPECT_EQ(PlanGradBuckets(table, dims.layers, size_t{1} << 30, sizeof(float)).size(), 1u);
  EXPECT_EQ(PlanGradBuckets(table, dims.layers, 4, sizeof(float)).size(),
            2u + 12u * dims.layers + 2u);
}

TEST(GradBucketPlanTest, TheElementSizeScalesTheCapacity) {
  const ModelDims dims = SmallDims();
  const std::vector<TensorInfo> table = ParamTable(dims);
  const size_t bytes = 16384;
  const std::vector<GradBucketPlan> fp32 = PlanGradBuckets(table, dims.layers, bytes, 4);
  const std::vector<GradBucketPlan> bf16 = PlanGradBuckets(table, dims.layers, bytes, 2);
  // The same pieces, twice as many elements per bf16 bucket, so at most as many buckets.
  EXPECT_LE(bf16.size(), fp32.size());
  for (const GradBucketPlan& b : bf16) {
    if (b.pieces.size() > 1) {
      EXPECT_LE(b.numel * 2, bytes);
    }
  }
  // fp32 buckets of 2x bytes are the bf16 buckets of x bytes.
  const std::vector<GradBucketPlan> same = PlanGradBuckets(table, dims.layers, 2 * bytes, 4);
  ASSERT_EQ(same.size(), bf16.size());
  for (size_t i = 0; i < same.size(); ++i) EXPECT_EQ(same[i].numel, bf16[i].numel);
}

TEST(GradBucketPlanTest, PipelineStageTablesKeepTheirStages) {
  const ModelDims dims = SmallDims();
  // The last stage without the first: its copy of wte is final with the head (stage L).
  ModelShard last;
  last.first_block = 1;
  last.last_block = dims.layers;
  const std::vector<TensorInfo> table = ShardTable(dims, last);
  const std::vector<GradBucketPlan> buckets = PlanGradBuckets(table, dims.layers, 1024, 4);
  const std::vector<int> hits = Coverage(buckets, ParamCount(table));
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  std::vector<int> stages;
  for (const GradBucketPlan& b : buckets) {
    for (const GradPiece& p : b.pieces) stages.push_back(p.stage);
  }
  EXPECT_EQ(stages.front(), dims.layers);
  EXPECT_EQ(std::count(stages.begin(), stages.end(), dims.layers), 3);  // lnfb, lnfw, wte
  EXPECT_EQ(std::count(stages.begin(), stages.end(), 0), 0);            // block 0 not here
  EXPECT_EQ(std::count(stages.begin(), stages.end(), -1), 0);           // no embeddings
  EXPECT_EQ(std::count(stages.begin(), stages.end(), 1), 12);
}

TEST(GradBucketPlanTest, PaddedLayoutShiftsPiecesAndPadsWte) {
  const ModelDims dims = SmallDims();
  const std::vector<TensorInfo> table = ParamTable(dims);
  const PaddedLayout layout = MakePaddedLayout(table, 64);
  const size_t pad = static_cast<size_t>(layout.padded_vocab - dims.vocab) * dims.channels;
  ASSERT_GT(pad, 0u);
  for (size_t bucket_bytes : {size_t{2}, size_t{2048}, size_t{1} << 30}) {
    SCOPED_TRACE(bucket_bytes);
    const std::vector<GradBucketPlan> plan = PlanGradBuckets(table, dims.layers, bucket_bytes, 2);
    const std::vector<GradBucketPlan> padded = ToPaddedLayout(plan, table, layout);
    ASSERT_EQ(padded.size(), plan.size());
    // The device buffer, padding rows included, is covered exactly once.
    const std::vector<int> hits = Coverage(padded, layout.total);
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    for (size_t i = 0; i < plan.size(); ++i) {
      ASSERT_EQ(padded[i].pieces.size(), plan[i].pieces.size());
      EXPECT_EQ(padded[i].last_stage, plan[i].last_stage);
      size_t numel = 0;
      for (size_t j = 0; j < plan[i].pieces.size(); ++j) {
        const GradPiece& from = plan[i].pieces[j];
        const GradPiece& to = padded[i].pieces[j];
        EXPECT_EQ(to.stage, from.stage);
        if (from.offset == 0) {
          // wte: first in the buffer, its Vp rows.
          EXPECT_EQ(to.offset, 0u);
          EXPECT_EQ(to.numel, from.numel + pad);
        } else {
          EXPECT_EQ(to.offset, from.offset + pad);
          EXPECT_EQ(to.numel, from.numel);
        }
        numel += to.numel;
      }
      EXPECT_EQ(padded[i].numel, numel);
    }
  }
  // A piece of the padded tensor that is not all of it cannot be mapped.
  std::vector<GradBucketPlan> partial(1);
  partial[0].pieces.push_back({0, 10, -1});
  partial[0].numel = 10;
  EXPECT_DEATH(ToPaddedLayout(partial, table, layout), "must be the whole tensor");
}

}  // namespace
}  // namespace loom::train
