// The worker's answer to a TraceRequest (worker/agent/trace_responder.h): the ranks' rings are
// read from their job's work dir, filtered by generation and step range, sent in bounded chunks
// and closed by a last chunk with the notes; a missing, foreign or hostile file is a note, and
// the rank environment names the ring (LOOM_TRACE_FILE).
#include "worker/agent/trace_responder.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent/rank_environment.h"
#include "worker/train/profiler/trace_ring.h"

namespace loom::worker {
namespace {

using loom::train::TraceKind;
using loom::train::TraceRing;
using ::testing::HasSubstr;

class TraceResponderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("loom-trace-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_ / "jobs" / "j1");
    options_.work_dir = root_.string();
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string JobDir() const { return (root_ / "jobs" / "j1").string(); }

  // A ring for `rank` of generation `generation` with `steps` steps of `per_step` records.
  std::unique_ptr<TraceRing> Ring(int rank, int64_t generation, int steps, int per_step,
                                  uint32_t capacity = 1024) {
    std::string error;
    std::unique_ptr<TraceRing> ring(
        TraceRing::Create(TraceFilePath(JobDir(), rank), capacity, rank, generation, &error));
    EXPECT_TRUE(ring) << error;
    for (int s = 1; s <= steps; ++s) {
      for (int i = 0; i < per_step; ++i) {
        ring->Append(i % 2 == 0 ? TraceKind::kForward : TraceKind::kBackward,
                     1'700'000'000'000'000'000 + s * 1'000'000 + i * 1000, 500, s, i / 2, 0, 0);
      }
    }
    return ring;
  }

  loom::v1::TraceRequest Request(int64_t first, int64_t last, std::vector<int> ranks) {
    loom::v1::TraceRequest r;
    r.set_request_id(42);
    r.set_job("jobs/j1");
    r.set_generation(3);
    r.set_first_step(first);
    r.set_last_step(last);
    for (int rank : ranks) r.add_ranks(rank);
    return r;
  }

  std::filesystem::path root_;
  TraceResponderOptions options_;
};

TEST_F(TraceResponderTest, SendsTheRangeInBoundedChunksThenALastChunk) {
  auto r0 = Ring(0, 3, 10, 40);
  auto r1 = Ring(1, 3, 10, 40);
  options_.max_chunk_bytes = 1000;  // a few dozen events per chunk
  std::vector<loom::v1::WorkerMessage> out =
      TraceResponder::Answer(Request(4, 6, {0, 1}), options_);
  ASSERT_GE(out.size(), 3u);
  std::map<int, int> events;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    const loom::v1::TraceChunk& c = out[i].trace_chunk();
    EXPECT_EQ(c.request_id(), 42u);
    EXPECT_FALSE(c.last());
    EXPECT_LE(c.ByteSizeLong(), 1000u + 64u);
    for (const loom::v1::TraceEvent& e : c.events()) {
      EXPECT_GE(e.step(), 4);
      EXPECT_LE(e.step(), 6);
      EXPECT_TRUE(e.kind() == loom::v1::TRACE_EVENT_KIND_FORWARD ||
                  e.kind() == loom::v1::TRACE_EVENT_KIND_BACKWARD);
      EXPECT_EQ(e.duration_nanos(), 500);
    }
    events[c.rank()] += c.events_size();
  }
  EXPECT_EQ(events[0], 120);
  EXPECT_EQ(events[1], 120);
  EXPECT_GT(out.size(), 4u);  // split: 120 events do not fit 1000 bytes
  const loom::v1::TraceChunk& last = out.back().trace_chunk();
  EXPECT_TRUE(last.last());
  EXPECT_EQ(last.rank(), -1);
  EXPECT_EQ(last.notes_size(), 0);
}

TEST_F(TraceResponderTest, MissingForeignAndHostileRingsAreNotes) {
  auto old = Ring(0, 2, 3, 2);    // an earlier generation's ring
  auto other = Ring(1, 3, 3, 2);  // fine
  // Rank 2: no file. Rank 3: garbage.
  std::ofstream(TraceFilePath(JobDir(), 3)) << "not a ring at all";
  std::vector<loom::v1::WorkerMessage> out =
      TraceResponder::Answer(Request(1, 3, {0, 1, 2, 3}), options_);
  const loom::v1::TraceChunk& last = out.back().trace_chunk();
  ASSERT_TRUE(last.last());
  std::string notes;
  for (const std::string& n : last.notes()) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("rank 0: the trace file is rank 0's of generation 2"));
  EXPECT_THAT(notes, HasSubstr("rank 2: no trace file"));
  EXPECT_THAT(notes, HasSubstr("rank 3: "));
  int rank1 = 0;
  for (const auto& m : out) {
    if (m.trace_chunk().rank() == 1) rank1 += m.trace_chunk().events_size();
    EXPECT_NE(m.trace_chunk().rank(), 0);
  }
  EXPECT_EQ(rank1, 6);
}

TEST_F(TraceResponderTest, OverwrittenStepsAndBadJobNamesAreNotes) {
  auto ring = Ring(0, 3, 10, 4, /*capacity=*/8);  // keeps steps 9 and 10 only
  std::vector<loom::v1::WorkerMessage> out = TraceResponder::Answer(Request(5, 10, {0}), options_);
  EXPECT_THAT(out.back().trace_chunk().notes(0), HasSubstr("step 9 and earlier were overwritten"));
  loom::v1::TraceRequest bad = Request(1, 2, {0});
  bad.set_job("jobs/../../etc");
  out = TraceResponder::Answer(bad, options_);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].trace_chunk().notes(0), HasSubstr("bad job name"));
}

TEST_F(TraceResponderTest, TheThreadAnswersThroughSend) {
  auto ring = Ring(0, 3, 2, 2);
  std::mutex mu;
  std::vector<loom::v1::WorkerMessage> sent;
  {
    TraceResponder responder(options_, [&](loom::v1::WorkerMessage m) {
      std::lock_guard<std::mutex> lock(mu);
      sent.push_back(std::move(m));
    });
    responder.Request(Request(1, 2, {0}));
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!sent.empty() && sent.back().trace_chunk().last()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].trace_chunk().events_size(), 4);
  EXPECT_TRUE(sent[1].trace_chunk().last());
}

TEST(TraceKindTest, TheRingsKindsAreTheWiresKinds) {
  // The worker converts a ring's kind to TraceEventKind by number: the two enums must agree.
  for (uint16_t k = 1; k <= static_cast<uint16_t>(TraceKind::kMax); ++k) {
    ASSERT_TRUE(loom::v1::TraceEventKind_IsValid(k)) << k;
    std::string wire = loom::v1::TraceEventKind_Name(static_cast<loom::v1::TraceEventKind>(k));
    wire = wire.substr(std::string("TRACE_EVENT_KIND_").size());
    for (char& c : wire) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(wire, loom::train::TraceKindName(k));
  }
  EXPECT_FALSE(loom::v1::TraceEventKind_IsValid(static_cast<int>(TraceKind::kMax) + 1));
}

TEST(RankEnvironmentTraceTest, TheRankIsToldWhereItsRingGoes) {
  loom::v1::Assignment a;
  a.set_job("jobs/j1");
  loom::v1::RankAssignment rank;
  rank.set_rank(5);
  RankPaths paths;
  paths.work_dir = "/w/jobs/j1";
  std::map<std::string, std::string> env = BuildRankEnvironment(a, rank, paths);
  EXPECT_EQ(env["LOOM_TRACE_FILE"], "/w/jobs/j1/trace-rank-5.ring");
}

}  // namespace
}  // namespace loom::worker
