// Checkpoint storage: the preflight that finds a read-only, full or too-long checkpoint.dir
// before training (permanent errors with errno), retention (checkpoint.keep), and the stack dump
// line of the collective counts.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/checkpoint/retention.h"
#include "worker/train/checkpoint/storage_check.h"
#include "worker/train/comm/collective_log.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

using ::testing::ElementsAre;
using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteText;

// A directory this process cannot write into: read-only permissions, or (as root, who ignores
// them) sysfs, which refuses new files.
std::string UnwritableDir(const TempDir& dir) {
  if (::geteuid() == 0) return "/sys";
  const std::string ro = dir / "ro";
  std::filesystem::create_directory(ro);
  ::chmod(ro.c_str(), 0555);
  return ro;
}

TEST(StorageCheckTest, AWritableDirectoryIsCreatedAndLeftClean) {
  TempDir dir;
  const std::string root = dir / "a/b/checkpoints";
  EXPECT_EQ(ErrorOf([&] { CheckCheckpointStorage(root, 1 << 20); }), "");
  ASSERT_TRUE(std::filesystem::is_directory(root));
  EXPECT_TRUE(std::filesystem::is_empty(root)) << "the probe file is removed";
}

TEST(StorageCheckTest, AnUnwritableDirectoryIsAnInputErrorWithErrno) {
  TempDir dir;
  const std::string error = ErrorOf([&] { CheckCheckpointStorage(UnwritableDir(dir), 1); });
  EXPECT_THAT(error, HasSubstr("checkpoint.dir: "));
  EXPECT_THAT(error, HasSubstr("is not writable"));
  EXPECT_THAT(error, ::testing::ContainsRegex("\\(errno [0-9]+\\)"));
}

TEST(StorageCheckTest, TooLittleFreeSpaceIsAnInputError) {
  TempDir dir;
  const std::string error = ErrorOf([&] { CheckCheckpointStorage(dir / "ck", uint64_t{1} << 62); });
  EXPECT_THAT(error, HasSubstr("needs about"));
  EXPECT_THAT(error, HasSubstr("No space left on device (errno 28)"));
}

TEST(StorageCheckTest, APathTooLongForCheckpointsIsAnInputError) {
  TempDir dir;
  std::string root = dir.path();
  while (root.size() < 4050) root += "/" + std::string(200, 'd');
  const std::string error = ErrorOf([&] { CheckCheckpointStorage(root, 1); });
  EXPECT_THAT(error, HasSubstr("checkpoint.dir: the path is"));
  EXPECT_THAT(error, HasSubstr("File name too long (errno 36)"));
}

TEST(StorageCheckTest, TheEstimateCountsParametersAndMoments) {
  // tiny: L=2, C=64, T=64, V=256 -> 256*64 + 64*64 + 2*(12*64*64 + 13*64) + 2*64 params.
  const ModelDims tiny{2, 64, 4, 64, 256};
  const uint64_t params = 256 * 64 + 64 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64;
  EXPECT_EQ(CheckpointBytesEstimate(tiny), params * 12);
}

// A complete checkpoint as ListCompleteCheckpoints sees it: a step directory with a manifest.
void FakeCheckpoint(const TempDir& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06d", step);
  std::filesystem::create_directories(dir / name);
  WriteText(dir / (std::string(name) + "/manifest.json"),
            "{\"step\": " + std::to_string(step) + "}");
  WriteText(dir / (std::string(name) + "/model.safetensors"), "x");
}

std::vector<std::string> Names(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(RetentionTest, KeepsTheNewestCompleteOnesAndNeverTouchesOthers) {
  TempDir dir;
  for (int step : {1, 2, 3, 4, 5}) FakeCheckpoint(dir, step);
  std::filesystem::create_directories(dir / "step-000006.gen-2.partial");  // being written
  std::filesystem::create_directories(dir / "step-000007");                // no manifest
  const std::vector<std::string> removed = PruneCheckpoints(dir.path(), 2);
  EXPECT_EQ(removed.size(), 3u);
  EXPECT_THAT(Names(dir), ElementsAre("step-000004", "step-000005", "step-000006.gen-2.partial",
                                      "step-000007"));
}

TEST(RetentionTest, ZeroKeepsEverythingAndTheLatestIsNeverRemoved) {
  TempDir dir;
  for (int step : {1, 2, 3}) FakeCheckpoint(dir, step);
  EXPECT_TRUE(PruneCheckpoints(dir.path(), 0).empty());
  EXPECT_EQ(Names(dir).size(), 3u);
  EXPECT_EQ(PruneCheckpoints(dir.path(), 1).size(), 2u);
  EXPECT_THAT(Names(dir), ElementsAre("step-000003"));
  EXPECT_TRUE(PruneCheckpoints(dir.path(), 1).empty());
}

TEST(CollectiveLogTest, FormatsEveryKindWithItsCount) {
  collective_log::Note(collective_log::kAllReduce);
  collective_log::Note(collective_log::kAllReduce);
  collective_log::Note(collective_log::kRecv);
  char line[256];
  const size_t n = collective_log::Format(line, sizeof(line));
  const std::string text(line, n);
  EXPECT_THAT(text, HasSubstr("last collectives: all_reduce #2, reduce_scatter #0"));
  EXPECT_THAT(text, HasSubstr("recv #1\n"));
  char tiny[8];
  EXPECT_EQ(collective_log::Format(tiny, sizeof(tiny)), 7u) << "cut, NUL-terminated";
}

}  // namespace
}  // namespace loom::train
