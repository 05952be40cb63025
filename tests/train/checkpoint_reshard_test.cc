// Sharded checkpoints: box-intersection copies, every rank writing its own shard, a commit that
// refuses incomplete shard sets, and loading under any other layout (tp x pp, or the whole model,
// or the first single-file format) with every element equal to the original global tensors.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/checkpoint/reshard.h"
#include "worker/train/checkpoint/safetensors.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/rng.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::KindAndErrorOf;
using testing::TempDir;

// ---------------------------------------------------------------------------------------------
// Boxes.

// The row-major offset of `index` (global coordinates) inside `box`.
int64_t OffsetIn(const Box& box, const std::vector<int64_t>& index) {
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) off = off * box.size[d] + (index[d] - box.start[d]);
  return off;
}

bool Inside(const Box& box, const std::vector<int64_t>& index) {
  for (size_t d = 0; d < index.size(); ++d) {
    if (index[d] < box.start[d] || index[d] >= box.start[d] + box.size[d]) return false;
  }
  return true;
}

// Calls fn(index) for every element of `box` in row-major order.
template <typename F>
void ForEachIndex(const Box& box, F fn) {
  const int64_t n = Volume(box);
  std::vector<int64_t> index(box.size.size());
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e;
    for (size_t d = box.size.size(); d-- > 0;) {
      index[d] = box.start[d] + rest % box.size[d];
      rest /= box.size[d];
    }
    fn(index);
  }
}

Box RandomBox(Rng* rng, const std::vector<int64_t>& view) {
  Box b;
  for (int64_t extent : view) {
    int64_t lo = static_cast<int64_t>(rng->NextU64() % extent);
    int64_t hi = lo + 1 + static_cast<int64_t>(rng->NextU64() % (extent - lo));
    b.start.push_back(lo);
    b.size.push_back(hi - lo);
  }
  return b;
}

TEST(ReshardTest, CopyIntersectionMatchesAnElementLoop) {
  Rng rng(7);
  int copies_that_met = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int rank = 1 + static_cast<int>(rng.NextU64() % 4);
    std::vector<int64_t> view;
    for (int d = 0; d < rank; ++d) view.push_back(1 + static_cast<int64_t>(rng.NextU64() % 6));
    // Full boxes now and then, so that the run-merging path (whole trailing dimensions) runs.
    Box src = trial % 5 == 0 ? FullBox(view) : RandomBox(&rng, view);
    Box dst = trial % 7 == 0 ? FullBox(view) : RandomBox(&rng, view);
    std::vector<float> src_data(Volume(src));
    for (float& x : src_data) x = static_cast<float>(rng.NextNormal());
    std::vector<float> dst_data(Volume(dst), -7.0f), want = dst_data;
    int64_t want_count = 0;
    ForEachIndex(FullBox(view), [&](const std::vector<int64_t>& i) {
      if (Inside(src, i) && Inside(dst, i)) {
        want[OffsetIn(dst, i)] = src_data[OffsetIn(src, i)];
        ++want_count;
      }
    });
    const int64_t count = CopyIntersection(src, src_data.data(), dst, dst_data.data());
    ASSERT_EQ(count, want_count) << "trial " << trial;
    ASSERT_EQ(dst_data, want) << "trial " << trial << " src " << BoxString(src) << " dst "
                              << BoxString(dst);
    copies_that_met += count > 0;
  }
  EXPECT_GT(copies_that_met, 100);  // the test exercised real copies, not only disjoint boxes
}

TEST(ReshardTest, RunsMergeWholeTrailingDimensions) {
  // Two boxes spanning all of dimensions 1 and 2: their common part is one run.
  Box a{{0, 0, 0}, {4, 3, 5}}, b{{1, 0, 0}, {2, 3, 5}};
  std::vector<std::vector<int64_t>> runs;
  ForEachRun(b, a, b, [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d, n}); });
  EXPECT_EQ(runs, (std::vector<std::vector<int64_t>>{{15, 0, 30}}));
  // A column slice: one run per row.
  Box cols{{0, 0}, {3, 2}}, all{{0, 0}, {3, 8}};
  runs.clear();
  ForEachRun(cols, all, cols, [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d, n}); });
  EXPECT_EQ(runs, (std::vector<std::vector<int64_t>>{{0, 0, 2}, {8, 2, 2}, {16, 4, 2}}));
}

TEST(ReshardTest, CoverageFindsOverlapsAndNamesGaps) {
  Box target = FullBox({4, 6});
  std::vector<Box> tiles = {{{0, 0}, {2, 6}}, {{2, 0}, {2, 3}}, {{2, 3}, {2, 3}}};
  EXPECT_EQ(CheckCoverage(target, tiles).kind, Coverage::Kind::kExact);
  // Pieces may reach beyond the target; only the part inside counts.
  EXPECT_EQ(CheckCoverage(Box{{1, 1}, {2, 2}}, tiles).kind, Coverage::Kind::kExact);

  std::vector<Box> gap = {tiles[0], tiles[2]};
  Coverage c = CheckCoverage(target, gap);
  EXPECT_EQ(c.kind, Coverage::Kind::kGap);
  EXPECT_EQ(BoxString(c.region), "[2:4, 0:3]");

  std::vector<Box> overlap = tiles;
  overlap.push_back({{1, 2}, {2, 2}});
  c = CheckCoverage(target, overlap);
  EXPECT_EQ(c.kind, Coverage::Kind::kOverlap);
  EXPECT_EQ(c.first, 0);
  EXPECT_EQ(c.second, 3);
  EXPECT_EQ(BoxString(c.region), "[1:2, 2:4]");
}

TEST(ReshardTest, SplitFlatRangeTilesExactlyTheRange) {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + static_cast<int>(rng.NextU64() % 4);
    std::vector<int64_t> view;
    for (int d = 0; d < rank; ++d) view.push_back(1 + static_cast<int64_t>(rng.NextU64() % 5));
    const Box box = RandomBox(&rng, view);
    const int64_t n = Volume(box);
    int64_t lo = static_cast<int64_t>(rng.NextU64() % (n + 1));
    int64_t hi = lo + static_cast<int64_t>(rng.NextU64() % (n - lo + 1));
    // Brute force: the index of each element of the box, in row-major order.
    std::vector<std::vector<int64_t>> order;
    ForEachIndex(box, [&](const std::vector<int64_t>& i) { order.push_back(i); });
    int64_t next = lo;
    const auto parts = SplitFlatRange(box, lo, hi);
    EXPECT_LE(parts.size(), static_cast<size_t>(2 * rank - 1));
    for (const auto& [part, first] : parts) {
      ASSERT_TRUE(Contains(box, part));
      ASSERT_EQ(first, next) << "trial " << trial;  // parts are consecutive, in order
      // The part's own row-major order is the box's order over [first, first + volume).
      int64_t k = first;
      ForEachIndex(part, [&](const std::vector<int64_t>& i) { ASSERT_EQ(i, order[k++]); });
      next = k;
    }
    EXPECT_EQ(next, hi) << "trial " << trial;
  }
}

// ---------------------------------------------------------------------------------------------
// Layouts.

// L=4 blocks, C=16, NH=4 (tp up to 4), maxT=8, V=24: small enough for every layout in
// milliseconds, with every kind of split present.
ModelDims Dims() { return ModelDims{4, 16, 4, 8, 24}; }

// The whole model's value of element `flat` (row-major) of tensor `tensor`, for the params
// (kind 0) and the moments m (1) and v (2). Distinct everywhere, so a misplaced copy shows.
float GlobalValue(int kind, size_t tensor, int64_t flat) {
  return static_cast<float>(kind * 1000000 + static_cast<int64_t>(tensor) * 10000 + flat) + 0.25f;
}

struct Layout {
  int tp;
  std::vector<int> blocks;  // per pipeline stage
  std::string Name() const {
    return "tp" + std::to_string(tp) + "-pp" + std::to_string(blocks.size());
  }
};

// One rank's part of the model under a layout, with its buffers.
struct Rank {
  std::string shard;
  std::vector<TensorInfo> table;
  std::vector<float> params, m, v;
};

std::vector<Rank> RanksOf(const Layout& layout) {
  std::vector<Rank> ranks;
  int first = 0;
  for (size_t stage = 0; stage < layout.blocks.size(); ++stage) {
    for (int r = 0; r < layout.tp; ++r) {
      ModelShard s{layout.tp, r, first, first + layout.blocks[stage]};
      Rank rank;
      rank.shard = ShardName(static_cast<int>(stage), r);
      rank.table = ShardTable(Dims(), s);
      const size_t n = ParamCount(rank.table);
      rank.params.assign(n, -1.0f);
      rank.m.assign(n, -1.0f);
      rank.v.assign(n, -1.0f);
      ranks.push_back(std::move(rank));
    }
    first += layout.blocks[stage];
  }
  return ranks;
}

// Calls fn(tensor index, local offset, global flat index) for every element a rank holds.
template <typename F>
void ForEachHeld(const std::vector<TensorInfo>& table, F fn) {
  for (size_t k = 0; k < table.size(); ++k) {
    const TensorInfo& t = table[k];
    if (t.numel == 0) continue;
    Box box{t.box_start, t.box_size};
    Box view = FullBox(t.view_shape);
    int64_t local = 0;
    ForEachIndex(box, [&](const std::vector<int64_t>& i) {
      fn(k, t.offset + local++, OffsetIn(view, i));  // the view is the tensor's memory order
    });
  }
}

void FillFromGlobal(Rank* rank) {
  ForEachHeld(rank->table, [&](size_t k, size_t at, int64_t flat) {
    rank->params[at] = GlobalValue(0, k, flat);
    rank->m[at] = GlobalValue(1, k, flat);
    rank->v[at] = GlobalValue(2, k, flat);
  });
}

// The number of held elements that differ from the global model (params, and m/v when
// `moments`).
int64_t Mismatches(const Rank& rank, bool moments) {
  int64_t bad = 0;
  ForEachHeld(rank.table, [&](size_t k, size_t at, int64_t flat) {
    bad += rank.params[at] != GlobalValue(0, k, flat);
    if (moments) {
      bad += rank.m[at] != GlobalValue(1, k, flat);
      bad += rank.v[at] != GlobalValue(2, k, flat);
    }
  });
  return bad;
}

CheckpointMeta MetaOf(const Layout& layout, int64_t step, int64_t generation) {
  CheckpointMeta meta;
  meta.step = step;
  meta.seed = 5;
  meta.generation = generation;
  meta.B = 2;
  meta.T = 8;
  meta.K = 1;
  meta.tp_size = layout.tp;
  meta.pp_size = static_cast<int>(layout.blocks.size());
  meta.blocks_per_stage = layout.blocks;
  meta.dims = Dims();
  meta.optimizer_step = step + 1000;
  return meta;
}

// Writes a checkpoint of the global model under `layout` (every rank's shard, then the commit).
std::string SaveUnder(const std::string& root, const Layout& layout, int64_t step,
                      int64_t generation = 1, bool moments = true) {
  std::vector<Rank> ranks = RanksOf(layout);
  CheckpointMeta meta = MetaOf(layout, step, generation);
  for (Rank& rank : ranks) {
    FillFromGlobal(&rank);
    const std::string dir = StageCheckpoint(root, step, generation);
    WriteShard(dir, rank.shard, rank.table, rank.params.data(), moments ? rank.m.data() : nullptr,
               moments ? rank.v.data() : nullptr);
    meta.shards.push_back(rank.shard);
  }
  return CommitCheckpoint(root, StageCheckpoint(root, step, generation), meta);
}

const std::vector<Layout>& Layouts() {
  static const auto* layouts = new std::vector<Layout>{{1, {4}}, {2, {2, 2}}, {1, {1, 1, 1, 1}},
                                                       {4, {4}}, {2, {1, 3}}, {4, {3, 1}}};
  return *layouts;
}

TEST(ShardedCheckpointTest, EveryLayoutLoadsUnderEveryOther) {
  for (const Layout& from : Layouts()) {
    TempDir dir;
    const std::string ck = SaveUnder(dir.path(), from, 30);
    EXPECT_EQ(ck, dir / "step-000030");
    ASSERT_EQ(FindLatestCheckpoint(dir.path()), ck);
    for (const Layout& to : Layouts()) {
      for (Rank& rank : RanksOf(to)) {
        CheckpointMeta meta = LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(),
                                                    rank.m.data(), rank.v.data());
        ASSERT_EQ(Mismatches(rank, true), 0)
            << from.Name() << " -> " << to.Name() << " rank " << rank.shard;
        EXPECT_EQ(meta.step, 30);
        EXPECT_EQ(meta.optimizer_step, 1030);
        EXPECT_EQ(meta.tp_size, from.tp);
        EXPECT_EQ(meta.blocks_per_stage, from.blocks);
        EXPECT_EQ(meta.shards.size(), from.blocks.size() * from.tp);
      }
    }
  }
}

TEST(ShardedCheckpointTest, ShardFilesHoldOwnedBoxesUnderGlobalNames) {
  TempDir dir;
  const std::string ck = SaveUnder(dir.path(), Layout{2, {2, 2}}, 1);
  // The last stage's tp rank 1 owns only its tp slices: no wte (tied copy), no replicas.
  SafetensorsFile f(ck + "/model-pp01-tp01.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, entry] : f.tensors()) names.push_back(name);
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre("qkvw", "qkvb", "attprojw", "fcw", "fcb", "fcprojw"));
  EXPECT_EQ(f.Find("qkvw")->shape, (std::vector<int64_t>{2, 24, 16}));  // (L_stage, 3C/tp, C)
  EXPECT_EQ(f.metadata().at("box.qkvw"),
            "{\"view\":[4,3,16,16],\"start\":[2,0,8,0],\"size\":[2,3,8,16]}");
  SafetensorsFile o(ck + "/optimizer-pp00-tp00.safetensors");
  EXPECT_NE(o.Find("m.wte"), nullptr);
  EXPECT_NE(o.Find("v.ln1w"), nullptr);
}

TEST(ShardedCheckpointTest, CommitRefusesAMissingShardNamingTheRegion) {
  TempDir dir;
  const Layout layout{2, {2, 2}};
  std::vector<Rank> ranks = RanksOf(layout);
  const std::string staging = StageCheckpoint(dir.path(), 40, 1);
  for (Rank& rank : ranks) {
    if (rank.shard == "pp01-tp01") continue;  // this rank "died" before writing
    FillFromGlobal(&rank);
    WriteShard(staging, rank.shard, rank.table, rank.params.data(), rank.m.data(), rank.v.data());
  }
  CheckpointMeta meta = MetaOf(layout, 40, 1);
  // Taking whatever was written: the coverage check finds the hole.
  EXPECT_THAT(KindAndErrorOf([&] { CommitCheckpoint(dir.path(), staging, meta); }),
              HasSubstr("IoError: " + staging +
                        ": not a complete checkpoint: tensor "
                        "\"attprojw\": [2:4, 0:16, 8:16] of [0:4, 0:16, 0:16] is in no shard"));
  // Expecting the four shards: the missing one is named.
  for (const Rank& rank : ranks) meta.shards.push_back(rank.shard);
  EXPECT_THAT(KindAndErrorOf([&] { CommitCheckpoint(dir.path(), staging, meta); }),
              HasSubstr("shard \"pp01-tp01\" (model-pp01-tp01.safetensors) was not written"));
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000040"));
  EXPECT_EQ(FindLatestCheckpoint(dir.path()), std::nullopt);

  // A shard that saved parameters but no moments, while the others saved theirs: the moments
  // have a hole.
  Rank& last = ranks.back();
  FillFromGlobal(&last);
  WriteShard(staging, last.shard, last.table, last.params.data(), nullptr, nullptr);
  EXPECT_THAT(KindAndErrorOf([&] { CommitCheckpoint(dir.path(), staging, meta); }),
              HasSubstr("tensor \"m.attprojw\": [2:4, 0:16, 8:16] of [0:4, 0:16, 0:16] is in "
                        "no shard"));
  // A shard set that overlaps (a whole-model shard beside the tp shards) is refused too.
  Rank whole = RanksOf(Layout{1, {4}})[0];
  FillFromGlobal(&whole);
  WriteShard(staging, "whole", whole.table, whole.params.data(), whole.m.data(), whole.v.data());
  meta.shards.clear();
  EXPECT_THAT(KindAndErrorOf([&] { CommitCheckpoint(dir.path(), staging, meta); }),
              HasSubstr("tensor \"attprojb\": model-pp00-tp00.safetensors and "
                        "model-whole.safetensors both hold [0:2, 0:16]"));
  EXPECT_EQ(FindLatestCheckpoint(dir.path()), std::nullopt);
  // Told which shards to expect, the commit drops the stray one and publishes.
  for (const Rank& rank : ranks) meta.shards.push_back(rank.shard);
  WriteShard(staging, last.shard, last.table, last.params.data(), last.m.data(), last.v.data());
  EXPECT_EQ(CommitCheckpoint(dir.path(), staging, meta), dir / "step-000040");
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000040/model-whole.safetensors"));
}

TEST(ShardedCheckpointTest, ACrashBeforeCommitPublishesNothingAndTheNextRunRecovers) {
  TempDir dir;
  const std::string first = SaveUnder(dir.path(), Layout{1, {4}}, 10, /*generation=*/1);
  // Generation 1 writes every shard of step 20, then crashes before the commit.
  const Layout old_layout{2, {2, 2}};
  std::vector<Rank> ranks = RanksOf(old_layout);
  for (Rank& rank : ranks) {
    FillFromGlobal(&rank);
    WriteShard(StageCheckpoint(dir.path(), 20, 1), rank.shard, rank.table, rank.params.data(),
               rank.m.data(), rank.v.data());
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "step-000020.gen-1.partial/manifest.json") == false);
  EXPECT_EQ(FindLatestCheckpoint(dir.path()), first);

  // Generation 2 resumes from step 10 under another layout and saves step 20 again: the stale
  // shards of generation 1 (which would overlap its own) do not get in the way, and go.
  const std::string second = SaveUnder(dir.path(), Layout{4, {3, 1}}, 20, /*generation=*/2);
  EXPECT_EQ(FindLatestCheckpoint(dir.path()), second);
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000020.gen-1.partial"));
  Rank whole = RanksOf(Layout{1, {4}})[0];
  LoadShardedCheckpoint(second, Dims(), whole.table, whole.params.data(), whole.m.data(),
                        whole.v.data());
  EXPECT_EQ(Mismatches(whole, true), 0);
  EXPECT_EQ(ReadCheckpointMeta(second).shards.size(), 8u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(second),
                          std::filesystem::directory_iterator()),
            2 * 8 + 1);  // model and optimizer per shard, and the manifest

  // A rerun of the same generation (standalone): stale shard files of other names are dropped
  // when the commit is told which shards to expect.
  for (Rank& rank : ranks) {
    WriteShard(StageCheckpoint(dir.path(), 30, 2), rank.shard, rank.table, rank.params.data(),
               rank.m.data(), rank.v.data());
  }
  const std::string third = SaveUnder(dir.path(), Layout{1, {4}}, 30, /*generation=*/2);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(third)) {
    files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"manifest.json", "model-pp00-tp00.safetensors",
                                             "optimizer-pp00-tp00.safetensors"}));

  // A stale optimizer file of a shard that this run saves without moments is not published.
  Rank one = RanksOf(Layout{1, {4}})[0];
  WriteShard(StageCheckpoint(dir.path(), 40, 2), one.shard, one.table, one.params.data(),
             one.m.data(), one.v.data());
  const std::string fourth = SaveUnder(dir.path(), Layout{1, {4}}, 40, 2, /*moments=*/false);
  EXPECT_FALSE(ReadCheckpointMeta(fourth).has_optimizer_state);
  EXPECT_FALSE(std::filesystem::exists(fourth + "/optimizer-pp00-tp00.safetensors"));
}

TEST(ShardedCheckpointTest, ShardsWrittenConcurrentlyIntoOneStagingDirectory) {
  TempDir dir;
  const Layout layout{2, {1, 1, 2}};
  std::vector<Rank> ranks = RanksOf(layout);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (Rank& rank : ranks) {
    threads.emplace_back([&dir, &rank, &errors] {
      try {
        FillFromGlobal(&rank);
        const std::string staging = StageCheckpoint(dir / "ck", 7, 3);  // all at once
        WriteShard(staging, rank.shard, rank.table, rank.params.data(), rank.m.data(),
                   rank.v.data());
      } catch (const std::exception&) {
        ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(errors.load(), 0);
  CheckpointMeta meta = MetaOf(layout, 7, 3);
  const std::string ck = CommitCheckpoint(dir / "ck", StageCheckpoint(dir / "ck", 7, 3), meta);
  EXPECT_EQ(ReadCheckpointMeta(ck).shards.size(), ranks.size());  // found by the commit
  for (Rank& rank : RanksOf(Layout{4, {2, 2}})) {
    LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), rank.m.data(), rank.v.data());
    EXPECT_EQ(Mismatches(rank, true), 0) << rank.shard;
  }
}

// ZeRO-1: each dp rank holds the moments of one range of its stage's flat buffer.
TEST(ShardedCheckpointTest, ZeroOneRangesSaveWithoutGatheringAndLoadUnderAnyOtherSplit) {
  TempDir dir;
  const Layout layout{2, {1, 3}};
  const int dp = 3;
  const std::string staging = StageCheckpoint(dir.path(), 9, 1);
  CheckpointMeta meta = MetaOf(layout, 9, 1);
  meta.dp_size = dp;
  meta.zero1 = true;
  for (Rank& rank : RanksOf(layout)) {
    FillFromGlobal(&rank);
    const size_t n = rank.params.size(), per = (n + dp - 1) / dp;
    for (int d = 0; d < dp; ++d) {
      const MomentRange range{std::min(n, d * per), std::min(n, (d + 1) * per)};
      // dp rank 0 writes the parameters; every dp rank its range of the moments, which it
      // holds alone (a buffer of range.end - range.begin floats).
      std::vector<float> m(rank.m.begin() + range.begin, rank.m.begin() + range.end);
      std::vector<float> v(rank.v.begin() + range.begin, rank.v.begin() + range.end);
      const std::string shard = rank.shard + "-dp" + std::to_string(d);
      WriteShard(staging, shard, rank.table, d == 0 ? rank.params.data() : nullptr, m.data(),
                 v.data(), range);
      meta.shards.push_back(shard);
    }
  }
  const std::string ck = CommitCheckpoint(dir.path(), staging, meta);
  EXPECT_TRUE(ReadCheckpointMeta(ck).zero1);
  // The ranges cut tensors: some were stored as several boxes.
  SafetensorsFile cut(ck + "/optimizer-pp01-tp00-dp1.safetensors");
  int extra_boxes = 0;
  for (const auto& [name, entry] : cut.tensors())
    extra_boxes += name.find('@') != std::string::npos;
  EXPECT_GT(extra_boxes, 0);
  // Whole moments under other layouts. The loader keeps one shard file open at a time: it
  // works with room for only a few more descriptors than are open now (fewer than the 12
  // optimizer files).
  const int open_now = static_cast<int>(std::distance(
      std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator()));
  struct rlimit old_limit {};
  ASSERT_EQ(0, getrlimit(RLIMIT_NOFILE, &old_limit));
  struct rlimit few = old_limit;
  few.rlim_cur = open_now + 4;
  ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &few));
  for (const Layout& to : {Layout{1, {4}}, Layout{4, {2, 2}}}) {
    for (Rank& rank : RanksOf(to)) {
      std::string error = KindAndErrorOf([&] {
        LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), rank.m.data(),
                              rank.v.data());
      });
      EXPECT_EQ(error, "");
      EXPECT_EQ(Mismatches(rank, true), 0) << to.Name() << " " << rank.shard;
    }
  }
  ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &old_limit));
  // Ranges of another dp size (2) under another layout, each into a buffer of its own.
  for (Rank& rank : RanksOf(Layout{4, {4}})) {
    const size_t n = rank.params.size(), half = n / 2 + 1;
    for (const MomentRange range : {MomentRange{0, half}, MomentRange{half, n}}) {
      std::vector<float> m(range.end - range.begin, -1.0f), v = m;
      LoadShardedCheckpoint(ck, Dims(), rank.table, nullptr, m.data(), v.data(), range);
      std::copy(m.begin(), m.end(), rank.m.begin() + range.begin);
      std::copy(v.begin(), v.end(), rank.v.begin() + range.begin);
    }
    LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), nullptr, nullptr);
    EXPECT_EQ(Mismatches(rank, true), 0) << rank.shard;
  }
}

// The first format, as the single-file code wrote it: whole tensors without boxes, and a
// version 1 manifest.
std::string WriteFirstFormat(const std::string& dir) {
  std::filesystem::create_directories(dir);
  Rank whole = RanksOf(Layout{1, {4}})[0];
  FillFromGlobal(&whole);
  std::vector<TensorToWrite> model, moments, v;
  for (const TensorInfo& t : whole.table) {
    model.push_back({t.name, t.global_shape, whole.params.data() + t.offset});
    moments.push_back({"m." + t.name, t.global_shape, whole.m.data() + t.offset});
    v.push_back({"v." + t.name, t.global_shape, whole.v.data() + t.offset});
  }
  moments.insert(moments.end(), v.begin(), v.end());
  WriteSafetensors(dir + "/model.safetensors", model, {{"format", "loom-checkpoint"}});
  WriteSafetensors(dir + "/optimizer.safetensors", moments, {{"format", "loom-checkpoint"}});
  const auto size = [&](const char* f) {
    return std::to_string(testing::ReadText(dir + "/" + f).size());
  };
  testing::WriteText(
      dir + "/manifest.json",
      "{\"format\":\"loom-checkpoint\",\"version\":1,\"step\":12,\"generation\":1,\"seed\":5,"
      "\"data_position\":{\"sampler\":\"hash-v1\",\"step\":12,\"sequences_consumed\":24},"
      "\"rng_state\":{\"kind\":\"counter\",\"seed\":5,\"counter\":12},"
      "\"layout\":{\"data\":1,\"tensor\":1,\"pipeline\":1,\"micro_batch\":2,"
      "\"num_micro_batches\":1,\"seq_len\":8},"
      "\"model\":{\"layers\":4,\"hidden\":16,\"heads\":4,\"seq_len\":8,\"vocab\":24},"
      "\"optimizer\":{\"step\":12},\"files\":[{\"name\":\"model.safetensors\",\"bytes\":" +
          size("model.safetensors") + "},{\"name\":\"optimizer.safetensors\",\"bytes\":" +
          size("optimizer.safetensors") + "}]}\n");
  return dir;
}

TEST(ShardedCheckpointTest, TheFirstSingleFileFormatLoadsUnderAnyLayout) {
  TempDir dir;
  const std::string ck = WriteFirstFormat(dir / "step-000012");
  ASSERT_EQ(FindLatestCheckpoint(dir.path()), ck);
  for (const Layout& to : Layouts()) {
    for (Rank& rank : RanksOf(to)) {
      CheckpointMeta meta = LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(),
                                                  rank.m.data(), rank.v.data());
      ASSERT_EQ(Mismatches(rank, true), 0) << to.Name() << " " << rank.shard;
      EXPECT_EQ(meta.optimizer_step, 12);
      EXPECT_EQ(meta.shards, std::vector<std::string>{""});
    }
  }
  // And through the single-rank wrapper.
  GPT model(Dims());
  AdamW optimizer(model.num_params(), AdamWConfig{});
  LoadCheckpoint(ck, &model, &optimizer);
  Rank whole = RanksOf(Layout{1, {4}})[0];
  std::memcpy(whole.params.data(), model.params(), model.num_params() * sizeof(float));
  EXPECT_EQ(Mismatches(whole, false), 0);
  EXPECT_EQ(optimizer.step(), 12);
}

TEST(ShardedCheckpointTest, LoadErrorsNameTheFileAndWhatWasExpected) {
  TempDir dir;
  const std::string ck = SaveUnder(dir / "a", Layout{2, {2, 2}}, 3, 1, /*moments=*/false);
  Rank rank = RanksOf(Layout{4, {4}})[1];
  // Parameters alone load; asking for the missing moments is an error.
  LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), nullptr, nullptr);
  EXPECT_EQ(Mismatches(rank, false), 0);
  EXPECT_FALSE(ReadCheckpointMeta(ck).has_optimizer_state);
  EXPECT_THAT(KindAndErrorOf([&] {
                LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), rank.m.data(),
                                      rank.v.data());
              }),
              HasSubstr("InputError: " + ck +
                        "/manifest.json: the checkpoint holds no "
                        "optimizer state"));
  ModelDims other = Dims();
  other.vocab = 32;
  std::vector<TensorInfo> other_table = ShardTable(other, ModelShard{});
  std::vector<float> buf(ParamCount(other_table));
  EXPECT_THAT(
      KindAndErrorOf([&] { LoadShardedCheckpoint(ck, other, other_table, buf.data(), nullptr, nullptr); }),
      HasSubstr("checkpoint model L=4 C=16 NH=4 maxT=8 V=24 does not match the "
                "configured model L=4 C=16 NH=4 maxT=8 V=32"));
  std::filesystem::resize_file(ck + "/model-pp01-tp00.safetensors", 100);
  EXPECT_THAT(KindAndErrorOf([&] {
                LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), nullptr, nullptr);
              }),
              HasSubstr("model-pp01-tp00.safetensors: 100 bytes, the manifest lists"));
  std::filesystem::remove(ck + "/model-pp01-tp00.safetensors");
  EXPECT_THAT(KindAndErrorOf([&] {
                LoadShardedCheckpoint(ck, Dims(), rank.table, rank.params.data(), nullptr, nullptr);
              }),
              HasSubstr("model-pp01-tp00.safetensors: missing (listed in"));
}

TEST(ShardedCheckpointTest, LoadRefusesARegionNoShardHolds) {
  TempDir dir;
  // A committed checkpoint whose manifest is then edited to drop one shard's file: the loader
  // must not trust the manifest's shard set, but check the coverage of what it fills.
  const std::string ck = SaveUnder(dir.path(), Layout{2, {4}}, 3, 1, /*moments=*/false);
  std::string manifest = testing::ReadText(ck + "/manifest.json");
  const std::string entry = "{\"name\":\"model-pp00-tp01.safetensors\",\"bytes\":";
  size_t at = manifest.find(entry);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(manifest[at - 1], ',');
  size_t end = manifest.find('}', at);
  manifest.erase(at - 1, end - at + 2);  // the comma before the entry, and the entry
  testing::WriteText(ck + "/manifest.json", manifest);
  Rank whole = RanksOf(Layout{1, {4}})[0];
  EXPECT_THAT(KindAndErrorOf([&] {
                LoadShardedCheckpoint(ck, Dims(), whole.table, whole.params.data(), nullptr,
                                      nullptr);
              }),
              HasSubstr("InputError: " + ck +
                        ": tensor \"qkvw\": [0:4, 0:3, 8:16, 0:16] of "
                        "[0:4, 0:3, 0:16, 0:16] is in no shard"));
  // The tp rank 0 half is still complete.
  Rank half = RanksOf(Layout{2, {4}})[0];
  LoadShardedCheckpoint(ck, Dims(), half.table, half.params.data(), nullptr, nullptr);
  EXPECT_EQ(Mismatches(half, false), 0);
}

}  // namespace
}  // namespace loom::train
