// OutboundBuffer: order across kinds, bounds that drop logs and steps but never statuses, the
// in-flight accounting, and the re-sending of EXITED statuses after a reconnect.
#include "worker/agent/outbound_buffer.h"

#include <thread>

#include "absl/time/clock.h"
#include "common/rank_status_batch.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

v1::RankStatus Status(int rank, v1::RankPhase phase) {
  v1::RankStatus s;
  s.set_job("jobs/a");
  s.set_rank(rank);
  s.set_phase(phase);
  return s;
}

v1::LogChunk Logs(int rank, int lines, size_t bytes_per_line = 10) {
  v1::LogChunk c;
  c.set_rank(rank);
  for (int i = 0; i < lines; ++i) c.add_lines(std::string(bytes_per_line, 'x'));
  return c;
}

v1::WorkerMessage PopNow(OutboundBuffer& b) {
  auto m = b.Pop(absl::Now());
  EXPECT_TRUE(m.has_value());
  b.MarkSent(*m);
  return m.value_or(v1::WorkerMessage());
}

TEST(OutboundBufferTest, KeepsTheOrderAcrossKinds) {
  OutboundBuffer b;
  b.OnRankStatus(Status(0, v1::RANK_PHASE_RUNNING));
  b.OnLogChunk(Logs(0, 1));
  v1::StepReport step;
  step.set_step(1);
  b.OnStepReport(step);
  b.OnRankStatus(Status(0, v1::RANK_PHASE_EXITED));
  EXPECT_TRUE(PopNow(b).has_rank_status());
  EXPECT_TRUE(PopNow(b).has_logs());
  EXPECT_TRUE(PopNow(b).has_step());
  EXPECT_EQ(PopNow(b).rank_status().phase(), v1::RANK_PHASE_EXITED);
  EXPECT_FALSE(b.Pop(absl::Now()).has_value());
  EXPECT_TRUE(b.WaitDrained(absl::Now()));
}

TEST(OutboundBufferTest, BoundsLogsAndStepsButNeverDropsStatuses) {
  OutboundLimits limits;
  limits.max_log_bytes = 1000;
  limits.max_step_reports = 3;
  OutboundBuffer b(limits);
  for (int i = 0; i < 100; ++i) {
    b.OnLogChunk(Logs(i, 5, 20));
    v1::StepReport step;
    step.set_step(i);
    b.OnStepReport(step);
    b.OnRankStatus(Status(i, v1::RANK_PHASE_EXITED));
  }
  EXPECT_GT(b.dropped_logs(), 90);
  EXPECT_EQ(b.dropped_steps(), 97);
  int statuses = 0, last_step = -1, last_log_rank = -1;
  while (auto m = b.Pop(absl::Now())) {
    b.MarkSent(*m);
    if (m->has_rank_status()) {
      EXPECT_EQ(m->rank_status().rank(), statuses++);
    }
    if (m->has_step()) last_step = m->step().step();
    if (m->has_logs()) last_log_rank = m->logs().rank();
  }
  EXPECT_EQ(statuses, 100);
  EXPECT_EQ(last_step, 99);      // the newest survive
  EXPECT_EQ(last_log_rank, 99);
}

TEST(OutboundBufferTest, UnpopPutsAMessageBackFirst) {
  OutboundBuffer b;
  b.OnRankStatus(Status(1, v1::RANK_PHASE_RUNNING));
  b.OnRankStatus(Status(2, v1::RANK_PHASE_RUNNING));
  auto m = b.Pop(absl::Now());
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(b.WaitDrained(absl::Now()));  // one in flight
  b.Unpop(*m);
  EXPECT_EQ(PopNow(b).rank_status().rank(), 1);
  EXPECT_EQ(PopNow(b).rank_status().rank(), 2);
}

TEST(OutboundBufferTest, RequeuesSentExitsAfterAReconnect) {
  OutboundBuffer b;
  b.OnRankStatus(Status(0, v1::RANK_PHASE_RUNNING));
  b.OnRankStatus(Status(0, v1::RANK_PHASE_EXITED));
  b.OnRankStatus(Status(1, v1::RANK_PHASE_EXITED));
  for (int i = 0; i < 3; ++i) PopNow(b);
  b.OnLogChunk(Logs(5, 1));  // produced while disconnected
  b.RequeueSentExits();
  EXPECT_EQ(PopNow(b).rank_status().rank(), 0);
  EXPECT_EQ(PopNow(b).rank_status().rank(), 1);
  EXPECT_TRUE(PopNow(b).has_logs());
  b.RequeueSentExits();  // only what was written since the last requeue
  EXPECT_EQ(PopNow(b).rank_status().rank(), 0);
  EXPECT_EQ(PopNow(b).rank_status().rank(), 1);
  EXPECT_FALSE(b.Pop(absl::Now()).has_value());
}

// The ranks of a message's statuses, "3" for a single one, "0 1 2" for a batch, or its kind.
std::string Ranks(const v1::WorkerMessage& m) {
  if (m.has_rank_status()) return std::to_string(m.rank_status().rank());
  if (m.has_rank_statuses()) {
    std::string out;
    for (const v1::RankStatus& s : m.rank_statuses().statuses()) {
      out += (out.empty() ? "" : " ") + std::to_string(s.rank());
    }
    return out;
  }
  if (m.has_logs()) return "logs";
  if (m.has_stack_dump()) return "dump";
  return "other";
}

TEST(OutboundBufferTest, BatchesStatusesQueuedTogetherWithoutReorderingOtherKinds) {
  OutboundBuffer b;
  b.OnRankStatuses({Status(0, v1::RANK_PHASE_RUNNING), Status(1, v1::RANK_PHASE_RUNNING),
                    Status(2, v1::RANK_PHASE_RUNNING)});
  b.OnLogChunk(Logs(0, 1));
  b.OnRankStatus(Status(3, v1::RANK_PHASE_RUNNING));
  b.OnRankStatus(Status(4, v1::RANK_PHASE_RUNNING));
  b.OnStackDump(v1::StackDump());  // queued with the statuses, but not a status
  b.OnRankStatus(Status(5, v1::RANK_PHASE_EXITED));
  std::vector<std::string> popped;
  while (auto m = b.Pop(absl::Now(), nullptr, nullptr, /*max_batch=*/16)) {
    popped.push_back(Ranks(*m));
    b.MarkSent(*m);
  }
  EXPECT_EQ(popped, (std::vector<std::string>{"0 1 2", "logs", "3 4", "dump", "5"}));
  EXPECT_TRUE(b.WaitDrained(absl::Now()));

  // At most max_batch statuses per message; without a bound, one status per message as before.
  for (int rank = 0; rank < 5; ++rank) b.OnRankStatus(Status(rank, v1::RANK_PHASE_RUNNING));
  popped.clear();
  while (auto m = b.Pop(absl::Now(), nullptr, nullptr, /*max_batch=*/2)) {
    popped.push_back(Ranks(*m));
    b.MarkSent(*m);
  }
  EXPECT_EQ(popped, (std::vector<std::string>{"0 1", "2 3", "4"}));
  b.OnRankStatuses({Status(0, v1::RANK_PHASE_RUNNING), Status(1, v1::RANK_PHASE_RUNNING)});
  EXPECT_EQ(PopNow(b).rank_status().rank(), 0);
  EXPECT_EQ(PopNow(b).rank_status().rank(), 1);

  // And at most kMaxRankStatusBatchBytes of statuses: long messages split the run.
  for (int rank = 0; rank < 5; ++rank) {
    v1::RankStatus s = Status(rank, v1::RANK_PHASE_EXITED);
    s.set_message(std::string(kMaxRankStatusBatchBytes / 2 - 100, 'x'));
    b.OnRankStatus(s);
  }
  popped.clear();
  while (auto m = b.Pop(absl::Now(), nullptr, nullptr, /*max_batch=*/16)) {
    EXPECT_LE(m->ByteSizeLong(), kMaxRankStatusBatchBytes + 64);
    popped.push_back(Ranks(*m));
    b.MarkSent(*m);
  }
  EXPECT_EQ(popped, (std::vector<std::string>{"0 1", "2 3", "4"}));
}

TEST(OutboundBufferTest, ABatchIsInFlightUntilSentAndComesBackAsSingleStatuses) {
  OutboundBuffer b;
  b.OnRankStatuses({Status(0, v1::RANK_PHASE_EXITED), Status(1, v1::RANK_PHASE_EXITED),
                    Status(2, v1::RANK_PHASE_RUNNING)});
  auto batch = b.Pop(absl::Now(), nullptr, nullptr, 16);
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->rank_statuses().statuses_size(), 3);
  EXPECT_FALSE(b.WaitDrained(absl::Now()));  // three statuses in flight
  b.Unpop(*batch);                           // the write failed
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(PopNow(b).rank_status().rank(), 0);  // single again, in their order
  EXPECT_EQ(PopNow(b).rank_status().rank(), 1);
  b.OnRankStatus(Status(3, v1::RANK_PHASE_EXITED));
  batch = b.Pop(absl::Now(), nullptr, nullptr, 16);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(Ranks(*batch), "2 3");
  b.MarkSent(*batch);
  EXPECT_TRUE(b.WaitDrained(absl::Now()));
  // The exits written in the batch are remembered like single ones: 0, 1 (single), then 3.
  b.RequeueSentExits();
  EXPECT_EQ(Ranks(*b.Pop(absl::Now(), nullptr, nullptr, 16)), "0 1 3");
}

TEST(OutboundBufferTest, PopWakesForNewMessagesAndCancel) {
  OutboundBuffer b;
  std::thread producer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    b.OnRankStatus(Status(7, v1::RANK_PHASE_RUNNING));
  });
  auto m = b.Pop(absl::Now() + absl::Seconds(10));
  producer.join();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rank_status().rank(), 7);
  b.MarkSent(*m);

  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    cancel.store(true);
    b.Wake();
  });
  const absl::Time start = absl::Now();
  EXPECT_FALSE(b.Pop(absl::Now() + absl::Seconds(10), &cancel).has_value());
  canceller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace loom::worker
