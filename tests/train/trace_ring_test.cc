// The trace ring (worker/train/profiler/trace_ring.h): records round-trip through the mapped
// file, the ring wraps keeping the newest, and the reader skips torn records and refuses hostile
// headers and files without reading out of bounds; the trainer records every phase of a step.
#include "worker/train/profiler/trace_ring.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/profiler/trace_recorder.h"
#include "worker/train/trainer.h"

namespace loom::train {
namespace {

using testing::TempDir;

std::unique_ptr<TraceRing> MakeRing(const std::string& path, uint32_t capacity) {
  std::string error;
  std::unique_ptr<TraceRing> ring(TraceRing::Create(path, capacity, 3, 7, &error));
  EXPECT_TRUE(ring) << error;
  return ring;
}

void AppendSteps(TraceRing& ring, int from, int to) {
  for (int i = from; i < to; ++i) {
    ring.Append(TraceKind::kForward, 1'000'000'000 + i * 1000, 500, /*step=*/i + 1, /*micro=*/i % 4,
                /*bytes=*/64u * i, /*aux=*/1);
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(TraceRingTest, RecordsRoundTripThroughTheFile) {
  TempDir dir;
  const std::string path = dir / "rank-3.ring";
  std::unique_ptr<TraceRing> ring = MakeRing(path, 16);
  AppendSteps(*ring, 0, 5);
  TraceReadResult got = ReadTraceFile(path, 1 << 20);
  ASSERT_TRUE(got.ok) << (got.notes.empty() ? "" : got.notes[0]);
  EXPECT_EQ(got.rank, 3);
  EXPECT_EQ(got.generation, 7);
  EXPECT_EQ(got.written, 5u);
  ASSERT_EQ(got.records.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const TraceRecord& r = got.records[i];
    EXPECT_EQ(r.step, i + 1);
    EXPECT_EQ(r.micro, i % 4);
    EXPECT_EQ(r.bytes, 64u * i);
    EXPECT_EQ(r.dur_ns, 500);
    EXPECT_EQ(r.kind, static_cast<uint16_t>(TraceKind::kForward));
  }
  EXPECT_TRUE(got.notes.empty());
}

TEST(TraceRingTest, WrapsAroundKeepingTheNewestCapacityRecords) {
  TempDir dir;
  const std::string path = dir / "r.ring";
  std::unique_ptr<TraceRing> ring = MakeRing(path, 8);
  AppendSteps(*ring, 0, 21);
  TraceReadResult got = ReadTraceFile(path, 1 << 20);
  ASSERT_TRUE(got.ok);
  EXPECT_EQ(got.written, 21u);
  ASSERT_EQ(got.records.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got.records[i].step, 13 + 1 + i);
  EXPECT_EQ(got.torn, 0u);
}

TEST(TraceRingTest, ATornRecordIsSkippedWithANote) {
  TempDir dir;
  const std::string path = dir / "r.ring";
  std::unique_ptr<TraceRing> ring = MakeRing(path, 8);
  AppendSteps(*ring, 0, 6);
  std::string bytes = ReadAll(path);
  // Record 2 as a rank killed while writing it leaves it: seq 0, fields half new.
  const size_t at = sizeof(TraceFileHeader) + 2 * sizeof(TraceRecord);
  std::memset(&bytes[at], 0, sizeof(uint64_t));
  TraceReadResult got = ParseTraceRing(bytes.data(), bytes.size(), 6);
  ASSERT_TRUE(got.ok);
  EXPECT_EQ(got.torn, 1u);
  ASSERT_EQ(got.records.size(), 5u);
  EXPECT_EQ(got.records[2].step, 4);
  ASSERT_FALSE(got.notes.empty());
  EXPECT_NE(got.notes[0].find("torn"), std::string::npos);
}

TEST(TraceRingTest, RecordsTheWriterMayHaveOverwrittenDuringTheCopyAreDropped) {
  TempDir dir;
  const std::string path = dir / "r.ring";
  std::unique_ptr<TraceRing> ring = MakeRing(path, 8);
  AppendSteps(*ring, 0, 8);
  const std::string bytes = ReadAll(path);
  // The header said 8 when copied; 11 when read again: slots of records 0..2 may be new.
  TraceReadResult got = ParseTraceRing(bytes.data(), bytes.size(), 11);
  ASSERT_TRUE(got.ok);
  ASSERT_EQ(got.records.size(), 5u);
  EXPECT_EQ(got.records.front().step, 4);
}

TEST(TraceRingTest, HostileHeadersAreRefusedWithoutReadingOutOfBounds) {
  TempDir dir;
  const std::string path = dir / "r.ring";
  std::unique_ptr<TraceRing> ring = MakeRing(path, 8);
  AppendSteps(*ring, 0, 4);
  const std::string good = ReadAll(path);
  auto with_header = [&](auto edit) {
    std::string b = good;
    TraceFileHeader h;
    std::memcpy(&h, b.data(), sizeof(h));
    edit(h);
    std::memcpy(b.data(), &h, sizeof(h));
    return b;
  };
  // Parsed from an exact-size heap copy, so that ASan catches any read past the end.
  auto parse = [](const std::string& b, uint64_t after) {
    std::vector<char> exact(b.begin(), b.end());
    return ParseTraceRing(exact.data(), exact.size(), after);
  };
  EXPECT_FALSE(parse(with_header([](TraceFileHeader& h) { h.magic[0] = 'X'; }), 4).ok);
  EXPECT_FALSE(parse(with_header([](TraceFileHeader& h) { h.version = 99; }), 4).ok);
  EXPECT_FALSE(parse(with_header([](TraceFileHeader& h) { h.record_size = 8; }), 4).ok);
  EXPECT_FALSE(parse(with_header([](TraceFileHeader& h) { h.capacity = 0; }), 4).ok);
  EXPECT_FALSE(parse(with_header([](TraceFileHeader& h) { h.capacity = 0xffffffffu; }), 4).ok);
  // A capacity the file is too short for.
  TraceReadResult longer = parse(with_header([](TraceFileHeader& h) { h.capacity = 9; }), 4);
  EXPECT_FALSE(longer.ok);
  ASSERT_FALSE(longer.notes.empty());
  EXPECT_NE(longer.notes[0].find("shorter"), std::string::npos);
  // A count near 2^64: at most `capacity` slots are looked at, none of them matches.
  TraceReadResult huge =
      parse(with_header([](TraceFileHeader& h) { h.written = ~uint64_t{0}; }), ~uint64_t{0});
  EXPECT_TRUE(huge.ok);
  EXPECT_TRUE(huge.records.empty());
  EXPECT_EQ(huge.torn, 8u);
  // Too short for a header; a truncated file.
  EXPECT_FALSE(parse(good.substr(0, 10), 0).ok);
  EXPECT_FALSE(parse(good.substr(0, good.size() - 1), 4).ok);
}

TEST(TraceRingTest, ImplausibleRecordsAreSkipped) {
  TempDir dir;
  const std::string path = dir / "r.ring";
  std::unique_ptr<TraceRing> ring = MakeRing(path, 8);
  ring->Append(static_cast<TraceKind>(999), 1'000'000'000, 10, 1, -1, 0, -1);  // unknown kind
  ring->Append(TraceKind::kData, 1'000'000'000, 10, 0, -1, 0, -1);             // step 0
  ring->Append(TraceKind::kData, 1'000'000'000, 10, 1, -7, 0, -1);             // micro -7
  ring->Append(TraceKind::kData, 1'000'000'000, 10, 1, 0, 0, -1);              // fine
  std::string bytes = ReadAll(path);
  TraceRecord r;
  const size_t at = sizeof(TraceFileHeader) + 3 * sizeof(TraceRecord);
  std::memcpy(&r, &bytes[at], sizeof(r));
  r.dur_ns = -5;  // written past the writer's clamp by a hostile program
  std::memcpy(&bytes[at], &r, sizeof(r));
  TraceReadResult got = ParseTraceRing(bytes.data(), bytes.size(), 4);
  EXPECT_TRUE(got.ok);
  EXPECT_EQ(got.invalid, 4u);
  EXPECT_TRUE(got.records.empty());
}

TEST(TraceRingTest, MissingLinkedFifoAndOversizedFilesAreNotesNotCrashes) {
  TempDir dir;
  EXPECT_FALSE(ReadTraceFile(dir / "absent.ring", 1 << 20).ok);
  std::unique_ptr<TraceRing> ring = MakeRing(dir / "real.ring", 8);
  AppendSteps(*ring, 0, 2);
  ASSERT_EQ(::symlink((dir / "real.ring").c_str(), (dir / "link.ring").c_str()), 0);
  EXPECT_FALSE(ReadTraceFile(dir / "link.ring", 1 << 20).ok);
  ASSERT_EQ(::mkfifo((dir / "fifo.ring").c_str(), 0600), 0);
  TraceReadResult fifo = ReadTraceFile(dir / "fifo.ring", 1 << 20);  // must not block
  EXPECT_FALSE(fifo.ok);
  TraceReadResult big = ReadTraceFile(dir / "real.ring", 100);
  EXPECT_FALSE(big.ok);
  ASSERT_FALSE(big.notes.empty());
  EXPECT_NE(big.notes[0].find("over the 100"), std::string::npos);
}

TEST(TraceRingTest, ARingThatCannotBeMadeIsAnErrorNotACrash) {
  TempDir dir;
  std::string error;
  EXPECT_EQ(TraceRing::Create(dir / "no/such/dir/r.ring", 8, 0, 1, &error), nullptr);
  EXPECT_NE(error.find("no/such/dir/r.ring"), std::string::npos) << error;
  EXPECT_EQ(TraceRing::Create(dir / "r.ring", 0, 0, 1, &error), nullptr);
  EXPECT_NE(error.find("capacity"), std::string::npos) << error;
  // The recorder's Open turns tracing off (nullptr) with one line on stderr.
  EXPECT_EQ(TraceRecorder::Open(dir / "no/such/dir/r.ring", 0, 1), nullptr);
}

TEST(TraceRingTest, KindNamesCoverTheEnum) {
  EXPECT_STREQ(TraceKindName(static_cast<uint16_t>(TraceKind::kForward)), "forward");
  EXPECT_STREQ(TraceKindName(static_cast<uint16_t>(TraceKind::kZeroAllGather)), "zero_all_gather");
  EXPECT_STREQ(TraceKindName(0), "?");
  EXPECT_STREQ(TraceKindName(static_cast<uint16_t>(TraceKind::kMax) + 1), "?");
}

TEST(TraceRecorderTest, TheTrainerRecordsEveryPhaseOfEveryStepInOrder) {
  TempDir dir;
  JobConfig c = testing::TinyConfig(3);
  c.micro_batch = 2;  // two micro-batches per step
  Dataset data = Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
  BatchShape shape = ResolveBatchShape(c, RankEnv{});
  ASSERT_EQ(shape.K, 2);
  std::unique_ptr<TraceRecorder> trace = TraceRecorder::Open(dir / "t.ring", 0, 1, 1024);
  ASSERT_TRUE(trace);
  TrainerOptions options;
  options.trace = trace.get();
  Trainer trainer(c, shape, data, TrainerComms{}, options);
  for (int i = 0; i < 3; ++i) trainer.Step();

  TraceReadResult got = ReadTraceFile(dir / "t.ring", 1 << 20);
  ASSERT_TRUE(got.ok);
  std::map<int64_t, std::vector<TraceRecord>> by_step;
  for (const TraceRecord& r : got.records) by_step[r.step].push_back(r);
  ASSERT_EQ(by_step.size(), 3u);
  for (auto& [step, records] : by_step) {
    const TraceRecord* whole = nullptr;
    std::map<int, int64_t> forward_end, backward_start;
    int data = 0, optimizer = 0;
    for (const TraceRecord& r : records) {
      switch (static_cast<TraceKind>(r.kind)) {
        case TraceKind::kStep:
          whole = &r;
          break;
        case TraceKind::kForward:
          forward_end[r.micro] = r.start_ns + r.dur_ns;
          break;
        case TraceKind::kBackward:
          backward_start[r.micro] = r.start_ns;
          break;
        case TraceKind::kData:
          ++data;
          break;
        case TraceKind::kOptimizer:
          ++optimizer;
          break;
        default:
          break;
      }
    }
    ASSERT_NE(whole, nullptr) << "step " << step;
    EXPECT_EQ(data, 2);
    EXPECT_EQ(optimizer, 1);
    ASSERT_EQ(forward_end.size(), 2u);
    ASSERT_EQ(backward_start.size(), 2u);
    for (int m = 0; m < 2; ++m) EXPECT_LE(forward_end[m], backward_start[m]) << "micro " << m;
    for (const TraceRecord& r : records) {
      EXPECT_GE(r.start_ns, whole->start_ns);
      EXPECT_LE(r.start_ns + r.dur_ns, whole->start_ns + whole->dur_ns);
    }
  }
  EXPECT_LT(by_step[1].front().start_ns, by_step[2].front().start_ns);
}

}  // namespace
}  // namespace loom::train
