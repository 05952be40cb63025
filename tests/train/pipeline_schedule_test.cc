// The pipeline schedules (parallel/pipeline_schedule.h): each micro-batch is forwarded before
// it is backwarded, the stages' op lists can run together without deadlock when every forward
// waits for the stage above and every backward for the stage below, 1F1B keeps at most
// p - stage micro-batches in flight and GPipe all K.
#include "worker/train/parallel/pipeline_schedule.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

// Runs every stage's op list with blocking dependencies (forward m on stage s needs forward m
// on stage s - 1; backward m on stage s needs backward m on stage s + 1 and forward m on stage
// s), one op per stage per tick when ready. Returns the number of ticks, or -1 on a deadlock.
int Simulate(PipelineKind kind, int stages, int K) {
  std::vector<std::vector<PipeOp>> ops(stages);
  for (int s = 0; s < stages; ++s) ops[s] = StageSchedule(kind, stages, s, K);
  std::vector<std::vector<int>> fwd_done(stages, std::vector<int>(K, 0));
  std::vector<std::vector<int>> bwd_done(stages, std::vector<int>(K, 0));
  std::vector<size_t> next(stages, 0);
  int ticks = 0;
  while (true) {
    bool all_done = true, progressed = false;
    std::vector<std::pair<int, PipeOp>> run;  // ops finished this tick
    for (int s = 0; s < stages; ++s) {
      if (next[s] == ops[s].size()) continue;
      all_done = false;
      const PipeOp& op = ops[s][next[s]];
      bool ready;
      if (op.kind == PipeOp::kForward) {
        ready = s == 0 || fwd_done[s - 1][op.micro];
      } else {
        ready = fwd_done[s][op.micro] && (s == stages - 1 || bwd_done[s + 1][op.micro]);
      }
      if (ready) run.push_back({s, op});
    }
    if (all_done) return ticks;
    for (auto& [s, op] : run) {
      (op.kind == PipeOp::kForward ? fwd_done : bwd_done)[s][op.micro] = 1;
      ++next[s];
      progressed = true;
    }
    if (!progressed) return -1;
    ++ticks;
  }
}

TEST(PipelineScheduleTest, EveryMicroBatchForwardThenBackwardOnce) {
  for (PipelineKind kind : {PipelineKind::k1F1B, PipelineKind::kGPipe}) {
    for (int p = 1; p <= 5; ++p) {
      for (int K = 1; K <= 9; ++K) {
        for (int s = 0; s < p; ++s) {
          std::vector<PipeOp> ops = StageSchedule(kind, p, s, K);
          ASSERT_EQ(ops.size(), 2u * K);
          std::vector<int> state(K, 0);  // 0 fresh, 1 forwarded, 2 backwarded
          int last_backward = -1;
          for (const PipeOp& op : ops) {
            ASSERT_GE(op.micro, 0);
            ASSERT_LT(op.micro, K);
            if (op.kind == PipeOp::kForward) {
              EXPECT_EQ(state[op.micro], 0);
              state[op.micro] = 1;
            } else {
              EXPECT_EQ(state[op.micro], 1) << "backward before forward";
              state[op.micro] = 2;
              // In micro-batch order, so that slots m % SlotsNeeded never collide.
              EXPECT_EQ(op.micro, last_backward + 1);
              last_backward = op.micro;
            }
          }
          for (int m = 0; m < K; ++m) EXPECT_EQ(state[m], 2);
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, StagesRunTogetherWithoutDeadlock) {
  for (PipelineKind kind : {PipelineKind::k1F1B, PipelineKind::kGPipe}) {
    for (int p = 1; p <= 6; ++p) {
      for (int K = 1; K <= 10; ++K) {
        int ticks = Simulate(kind, p, K);
        EXPECT_GT(ticks, 0) << PipelineKindName(kind) << " p=" << p << " K=" << K;
        // With unit-time ops both schedules take the ideal 2 (K + p - 1) ticks.
        EXPECT_EQ(ticks, 2 * (K + p - 1)) << PipelineKindName(kind) << " p=" << p << " K=" << K;
      }
    }
  }
}

TEST(PipelineScheduleTest, InFlightBounds) {
  for (int p = 1; p <= 6; ++p) {
    for (int K = 1; K <= 10; ++K) {
      for (int s = 0; s < p; ++s) {
        const int one_f_one_b = SlotsNeeded(StageSchedule(PipelineKind::k1F1B, p, s, K));
        EXPECT_LE(one_f_one_b, p - s);
        EXPECT_EQ(one_f_one_b, std::min(p - s, K));
        EXPECT_EQ(SlotsNeeded(StageSchedule(PipelineKind::kGPipe, p, s, K)), K);
      }
    }
  }
}

TEST(PipelineScheduleTest, OneFOneBShape) {
  // Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, 3 pairs, 3 cool-down backwards.
  std::vector<PipeOp> ops = StageSchedule(PipelineKind::k1F1B, 4, 0, 6);
  const PipeOp F = {PipeOp::kForward, 0}, B = {PipeOp::kBackward, 0};
  auto f = [&](int m) { return PipeOp{F.kind, m}; };
  auto b = [&](int m) { return PipeOp{B.kind, m}; };
  std::vector<PipeOp> want = {f(0), f(1), f(2), f(3), b(0), f(4),
                              b(1), f(5), b(2), b(3), b(4), b(5)};
  EXPECT_EQ(ops, want);
  // The last stage alternates from the start.
  std::vector<PipeOp> last = StageSchedule(PipelineKind::k1F1B, 4, 3, 2);
  EXPECT_EQ(last, (std::vector<PipeOp>{f(0), b(0), f(1), b(1)}));
}

TEST(PipelineScheduleTest, BubbleFormulaAndNames) {
  EXPECT_DOUBLE_EQ(IdealBubbleRatio(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(IdealBubbleRatio(4, 4), 3.0 / 7.0);
  EXPECT_EQ(ParsePipelineKind("gpipe"), PipelineKind::kGPipe);
  EXPECT_EQ(ParsePipelineKind("1f1b"), PipelineKind::k1F1B);
  EXPECT_THROW(ParsePipelineKind("zigzag"), InputError);
}

}  // namespace
}  // namespace loom::train
