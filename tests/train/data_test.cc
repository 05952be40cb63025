// Token files, the built-in corpus, and the deterministic batch sampler.
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/data/dataset.h"
#include "worker/train/data/tiny_corpus.h"
#include "worker/train/data/token_file.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::ErrorOf;
using testing::TempDir;

// Writes a token file header (magic, version, count) and `payload_tokens` tokens.
void WriteRaw(const std::string& path, int32_t magic, int32_t version, int32_t count,
              const std::vector<uint16_t>& payload_tokens) {
  int32_t header[256] = {magic, version, count};
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(payload_tokens.data()),
            payload_tokens.size() * sizeof(uint16_t));
}

TEST(TokenFileTest, RoundTripThroughTheLlmcLayout) {
  TempDir dir;
  std::vector<uint16_t> tokens = {1, 2, 300, 65535, 0, 7};
  WriteTokenFile(dir / "t.bin", tokens);
  std::string bytes = testing::ReadText(dir / "t.bin");
  ASSERT_EQ(bytes.size(), 1024u + 12u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  TokenStream s = TokenStream::Open(dir / "t.bin", 65536);
  ASSERT_EQ(s.size(), tokens.size());
  EXPECT_EQ(std::vector<uint16_t>(s.data(), s.data() + s.size()), tokens);
  TokenStream moved = std::move(s);
  EXPECT_EQ(moved.data()[2], 300);
}

TEST(TokenFileTest, BadFilesGiveOneLineErrorsNamingTheFile) {
  TempDir dir;
  const std::string path = dir / "bad.bin";
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(dir / "missing.bin", 256); }),
              HasSubstr("missing.bin: cannot open token file"));
  testing::WriteText(path, "short");
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(path, 256); }),
              HasSubstr("bad.bin: too short for a token file"));
  WriteRaw(path, 12345, 1, 3, {1, 2, 3});
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(path, 256); }),
              HasSubstr("bad magic 12345, expected 20240520"));
  WriteRaw(path, 20240520, 2, 3, {1, 2, 3});
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(path, 256); }), HasSubstr("unsupported version 2"));
  WriteRaw(path, 20240520, 1, 10, {1, 2, 3});  // truncated
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(path, 256); }), HasSubstr("truncated"));
  WriteRaw(path, 20240520, 1, 3, {1, 256, 3});
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(path, 256); }),
              HasSubstr("token id 256 at position 1 is outside the model's vocabulary"));
  EXPECT_EQ(ErrorOf([&] { TokenStream::Open(path, 257); }), "");
  EXPECT_THAT(ErrorOf([&] { TokenStream::Open(dir.path(), 256); }),
              HasSubstr("not a regular file"));
}

TEST(DatasetTest, ValidationIsTheTailOrASeparateFile) {
  TempDir dir;
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 200;
  WriteTokenFile(dir / "train.bin", tokens);
  Dataset d = Dataset::Load(dir / "train.bin", "", "", 256, 16);
  EXPECT_EQ(d.train().size, 900u);
  EXPECT_EQ(d.val().size, 100u);
  EXPECT_EQ(d.val().data, d.train().data + 900);

  WriteTokenFile(dir / "val.bin", std::vector<uint16_t>(50, 3));
  Dataset e = Dataset::Load(dir / "train.bin", "", dir / "val.bin", 256, 16);
  EXPECT_EQ(e.train().size, 1000u);
  EXPECT_EQ(e.val().size, 50u);
  EXPECT_THAT(ErrorOf([&] { Dataset::Load(dir / "train.bin", "", dir / "val.bin", 256, 64); }),
              HasSubstr("val.bin: 50 tokens are too few"));
  EXPECT_THAT(ErrorOf([&] { Dataset::Load(dir / "train.bin", "", "", 256, 128); }),
              HasSubstr("train.bin: 1000 tokens are too few"));
  EXPECT_THAT(ErrorOf([&] { Dataset::Load("", "tiny-corpus", "", 100, 16); }),
              HasSubstr("model.vocab: tiny-corpus is byte-level"));
}

TEST(TinyCorpusTest, DeterministicStructuredText) {
  std::string a = TinyCorpusText();
  EXPECT_EQ(a, TinyCorpusText());
  EXPECT_EQ(a.size(), 64u * 1024u);
  EXPECT_NE(a.find("The "), std::string::npos);
  std::vector<uint16_t> tokens = TinyCorpusTokens();
  for (uint16_t t : tokens) ASSERT_LT(t, 128);  // ASCII
  const double h = UnigramEntropy(tokens);
  EXPECT_GT(h, 2.5);  // varied text, not a repeated phrase
  EXPECT_LT(h, 3.3);
}

TEST(SamplerTest, DeterministicBySeedStepRankAndMicroBatch) {
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 251);
  TokenRange range{tokens.data(), tokens.size()};
  const int B = 3, T = 8;
  BatchSampler a(range, 42, B, T, 2, 0), b(range, 42, B, T, 2, 0), c(range, 43, B, T, 2, 0);
  std::vector<int> in1(B * T), tg1(B * T), in2(B * T), tg2(B * T);
  a.Fill(5, 1, in1.data(), tg1.data());
  b.Fill(5, 1, in2.data(), tg2.data());
  EXPECT_EQ(in1, in2);
  EXPECT_EQ(tg1, tg2);
  for (int i = 0; i < B * T; ++i) {
    // Targets are the next tokens of a contiguous window.
    EXPECT_EQ(tg1[i], (in1[i] + 1) % 251);
  }
  c.Fill(5, 1, in2.data(), tg2.data());
  EXPECT_NE(in1, in2);  // another seed
  a.Fill(6, 1, in2.data(), tg2.data());
  EXPECT_NE(in1, in2);  // another step
  a.Fill(5, 0, in2.data(), tg2.data());
  EXPECT_NE(in1, in2);  // another micro-batch

  // Layout invariance: (B=3, K=2) and (B=6, K=1) draw the same six sequences of a step.
  BatchSampler wide(range, 42, 2 * B, T, 1, 0);
  std::vector<int> all(2 * B * T), all_t(2 * B * T), m0(B * T), m1(B * T);
  wide.Fill(9, 0, all.data(), all_t.data());
  a.Fill(9, 0, m0.data(), tg1.data());
  a.Fill(9, 1, m1.data(), tg1.data());
  m0.insert(m0.end(), m1.begin(), m1.end());
  EXPECT_EQ(all, m0);

  // Starting positions cover the range (no bias to one end).
  std::set<int> firsts;
  for (int step = 0; step < 200; ++step) {
    a.Fill(step, 0, in1.data(), tg1.data());
    firsts.insert(in1[0]);
  }
  EXPECT_GT(firsts.size(), 100u);
}

TEST(EvalBatchesTest, FixedWindowsFromTheStart) {
  std::vector<uint16_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  EvalBatches eval({tokens.data(), tokens.size()}, 2, 10, 32);
  EXPECT_EQ(eval.num_batches(), 5);  // 9 windows of 10 (+1) tokens, 2 per batch
  std::vector<int> in(20), tg(20);
  eval.Fill(1, in.data(), tg.data());
  EXPECT_EQ(in[0], 20);
  EXPECT_EQ(tg[9], 30);
  EXPECT_EQ(in[10], 30);
  eval.Fill(4, in.data(), tg.data());
  EXPECT_EQ(in[0], 80);
  EXPECT_EQ(in[10], 0);  // wraps around
}

}  // namespace
}  // namespace loom::train
