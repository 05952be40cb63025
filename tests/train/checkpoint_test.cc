// Checkpoints: safetensors files, the checkpoint directory protocol (atomic, a failed save
// destroys nothing), shape checks, and llm.c's model file.
#include "worker/train/checkpoint/checkpoint.h"

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/checkpoint/llmc.h"
#include "worker/train/checkpoint/safetensors.h"
#include "worker/train/config/json.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/rng.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::ErrorOf;
using testing::TempDir;

TEST(SafetensorsTest, RoundTripAndTheHeaderFormat) {
  TempDir dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-30f};
  std::vector<float> b = {42.0f};
  WriteSafetensors(dir / "x.safetensors", {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}},
                   {{"k", "v"}});
  // By hand: 8-byte little-endian length, JSON header, data at the offsets it names.
  std::string bytes = testing::ReadText(dir / "x.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  ASSERT_EQ(n % 8, 0u);
  Value header = ParseJson(bytes.substr(8, n), "header");
  EXPECT_EQ(header.Find("a")->Find("dtype")->text, "F32");
  EXPECT_EQ(header.Find("b")->Find("data_offsets")->items[0].text, "24");
  EXPECT_EQ(header.Find("__metadata__")->Find("k")->text, "v");
  float b0;
  std::memcpy(&b0, bytes.data() + 8 + n + 24, 4);
  EXPECT_EQ(b0, 42.0f);
  ASSERT_EQ(bytes.size(), 8 + n + 28);

  std::vector<float> a2(6, -1), b2(1, -1);
  auto meta =
      ReadSafetensors(dir / "x.safetensors", {{"a", {2, 3}, a2.data()}, {"b", {1}, b2.data()}});
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
  EXPECT_EQ(meta.at("k"), "v");

  EXPECT_THAT(
      ErrorOf([&] {
        ReadSafetensors(dir / "x.safetensors", {{"a", {3, 2}, a2.data()}, {"b", {1}, b2.data()}});
      }),
      HasSubstr("x.safetensors: tensor \"a\" has shape [2, 3], the model expects [3, 2]"));
  EXPECT_THAT(ErrorOf([&] {
                ReadSafetensors(dir / "x.safetensors", {{"a", {2, 3}, a2.data()}});
              }),
              HasSubstr("unexpected tensor \"b\""));
  EXPECT_THAT(ErrorOf([&] {
                ReadSafetensors(
                    dir / "x.safetensors",
                    {{"a", {2, 3}, a2.data()}, {"b", {1}, b2.data()}, {"c", {1}, b2.data()}});
              }),
              HasSubstr("tensor \"c\" is missing"));
  std::filesystem::resize_file(dir / "x.safetensors", bytes.size() - 4);  // truncate
  EXPECT_THAT(
      ErrorOf([&] {
        ReadSafetensors(dir / "x.safetensors", {{"a", {2, 3}, a2.data()}, {"b", {1}, b2.data()}});
      }),
      HasSubstr("truncated"));
  testing::WriteText(dir / "junk.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f"
                                                           "abc",
                                                           11));
  EXPECT_THAT(ErrorOf([&] { ReadSafetensors(dir / "junk.safetensors", {}); }),
              HasSubstr("does not fit the file"));
}

// A tiny model with random parameters and optimizer moments.
struct State {
  explicit State(const ModelDims& dims, uint64_t seed)
      : model(dims), optimizer(model.num_params(), AdamWConfig{}) {
    Rng rng(seed);
    for (size_t i = 0; i < model.num_params(); ++i) {
      model.params()[i] = static_cast<float>(rng.NextNormal());
      optimizer.m()[i] = static_cast<float>(rng.NextNormal());
      optimizer.v()[i] = static_cast<float>(rng.NextUniform());
    }
    optimizer.set_step(static_cast<int64_t>(seed));
  }
  GPT model;
  AdamW optimizer;
};

CheckpointMeta MetaFor(const GPT& model, int64_t step) {
  CheckpointMeta meta;
  meta.step = step;
  meta.seed = 1337;
  meta.generation = 2;
  meta.B = 4;
  meta.T = 32;
  meta.K = 1;
  meta.dims = model.dims();
  return meta;
}

TEST(CheckpointTest, SaveFindLoadRoundTrip) {
  TempDir dir;
  ModelDims dims = *PresetDims("tiny");
  State saved(dims, 11);
  EXPECT_EQ(FindLatestCheckpoint(dir / "ck"), std::nullopt);
  std::string path =
      SaveCheckpoint(dir / "ck", saved.model, saved.optimizer, MetaFor(saved.model, 100));
  EXPECT_EQ(path, dir / "ck/step-000100");
  SaveCheckpoint(dir / "ck", saved.model, saved.optimizer, MetaFor(saved.model, 20));
  // An incomplete newer directory (no manifest) is not a checkpoint.
  std::filesystem::create_directories(dir / "ck/step-000300");
  testing::WriteText(dir / "ck/step-000300/model.safetensors", "partial");
  EXPECT_EQ(FindLatestCheckpoint(dir / "ck"), dir / "ck/step-000100");

  State loaded(dims, 99);
  CheckpointMeta meta =
      LoadCheckpoint(*FindLatestCheckpoint(dir / "ck"), &loaded.model, &loaded.optimizer);
  EXPECT_EQ(meta.step, 100);
  EXPECT_EQ(meta.generation, 2);
  EXPECT_EQ(meta.B, 4);
  EXPECT_EQ(loaded.optimizer.step(), 11);
  const size_t bytes = saved.model.num_params() * sizeof(float);
  EXPECT_EQ(0, std::memcmp(saved.model.params(), loaded.model.params(), bytes));
  EXPECT_EQ(0, std::memcmp(saved.optimizer.m(), loaded.optimizer.m(), bytes));
  EXPECT_EQ(0, std::memcmp(saved.optimizer.v(), loaded.optimizer.v(), bytes));
}

TEST(CheckpointTest, ShapeMismatchAndDamageAreInputErrors) {
  TempDir dir;
  State saved(*PresetDims("tiny"), 1);
  std::string path =
      SaveCheckpoint(dir.path(), saved.model, saved.optimizer, MetaFor(saved.model, 5));
  ModelDims other = *PresetDims("tiny");
  other.channels = 32;
  State wrong(other, 2);
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(path, &wrong.model, &wrong.optimizer); }),
              HasSubstr("manifest.json: checkpoint model L=2 C=64 NH=4 maxT=64 V=256 does not "
                        "match the configured model L=2 C=32"));
  // The file list catches a damaged tensor file.
  std::filesystem::resize_file(path + "/optimizer.safetensors", 1000);
  State same(*PresetDims("tiny"), 3);
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(path, &same.model, &same.optimizer); }),
              HasSubstr("optimizer.safetensors: 1000 bytes, the manifest lists"));
}

TEST(CheckpointTest, FailedSaveLeavesExistingCheckpointsIntact) {
  TempDir dir;
  ModelDims dims = *PresetDims("tiny");
  State first(dims, 21);
  SaveCheckpoint(dir.path(), first.model, first.optimizer, MetaFor(first.model, 100));
  State second(dims, 22);
  // Make the disk "full": writes beyond 64 KiB fail (EFBIG), as they would on ENOSPC.
  struct rlimit old_limit {};
  ASSERT_EQ(0, getrlimit(RLIMIT_FSIZE, &old_limit));
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(0, setrlimit(RLIMIT_FSIZE, &small));
  // A new step, and the step already saved: neither failed save may touch step 100.
  int failures = 0;
  for (int64_t step : {200, 100}) {
    try {
      SaveCheckpoint(dir.path(), second.model, second.optimizer, MetaFor(second.model, step));
    } catch (const IoError& e) {
      ++failures;
      EXPECT_THAT(e.what(), HasSubstr("model.safetensors.tmp: write failed"));
    }
  }
  ASSERT_EQ(0, setrlimit(RLIMIT_FSIZE, &old_limit));
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(failures, 2);
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000200"));
  ASSERT_EQ(FindLatestCheckpoint(dir.path()), dir / "step-000100");
  State loaded(dims, 23);
  LoadCheckpoint(dir / "step-000100", &loaded.model, &loaded.optimizer);
  EXPECT_EQ(0, std::memcmp(first.model.params(), loaded.model.params(),
                           first.model.num_params() * sizeof(float)));

  // Saving the same step again replaces it whole.
  std::string again =
      SaveCheckpoint(dir.path(), second.model, second.optimizer, MetaFor(second.model, 100));
  LoadCheckpoint(again, &loaded.model, &loaded.optimizer);
  EXPECT_EQ(0, std::memcmp(second.model.params(), loaded.model.params(),
                           second.model.num_params() * sizeof(float)));
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000100.old"));
}

TEST(LlmcTest, ExportImportGivesIdenticalLogits) {
  TempDir dir;
  ModelDims dims{2, 32, 4, 16, 200};  // V=200 pads to Vp=256
  GPT a(dims);
  a.InitWeights(3);
  ExportLlmc(dir / "m.bin", a);
  std::string bytes = testing::ReadText(dir / "m.bin");
  int32_t header[8];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(std::vector<int32_t>(header, header + 8),
            (std::vector<int32_t>{20240326, 3, 16, 200, 2, 4, 32, 256}));
  const size_t padded_params = a.num_params() + (256 - 200) * 32;
  EXPECT_EQ(bytes.size(), 1024 + padded_params * sizeof(float));
  EXPECT_EQ(ReadLlmcDims(dir / "m.bin"), dims);

  GPT b(dims);
  b.InitWeights(4);
  ImportLlmc(dir / "m.bin", &b);
  std::vector<int> tokens(2 * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i * 7 % 200);
  a.Forward(tokens.data(), nullptr, 2, 16);
  b.Forward(tokens.data(), nullptr, 2, 16);
  EXPECT_EQ(0, std::memcmp(a.logits(), b.logits(), 2 * 16 * 200 * sizeof(float)));

  GPT wrong(*PresetDims("tiny"));
  EXPECT_THAT(ErrorOf([&] { ImportLlmc(dir / "m.bin", &wrong); }),
              HasSubstr("m.bin: model L=2 C=32 NH=4 maxT=16 V=200 does not match"));
  bytes[4] = 5;  // version 5: bf16
  testing::WriteText(dir / "bf16.bin", bytes);
  EXPECT_THAT(ErrorOf([&] { ReadLlmcDims(dir / "bf16.bin"); }), HasSubstr("version 5"));
  testing::WriteText(dir / "cut.bin", bytes.substr(0, 2000).replace(4, 1, 1, '\3'));
  EXPECT_THAT(ErrorOf([&] { ImportLlmc(dir / "cut.bin", &b); }), HasSubstr("truncated"));
}

}  // namespace
}  // namespace loom::train
