// One candidate layout: how the world is split (dp × tp × pp), the batch shape per data-parallel
// rank, and the memory-saving options. Rank order (docs/rank-contract.md) puts tp fastest, then
// dp, then pp: rank = tp_index + tp·(dp_index + dp·pp_index).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::planner {

enum class Recompute {
  kNone,       // keep every activation of the forward pass
  kSelective,  // recompute the attention core (softmax, its dropout, AV) in backward
  kFull,       // keep only each block's input; recompute the whole block in backward
};

enum class Schedule {
  k1F1B,   // one forward, one backward: stage i holds at most pp − i micro-batches
  kGPipe,  // all forwards, then all backwards: every stage holds all m micro-batches
};

absl::string_view RecomputeName(Recompute r);  // "none" | "selective" | "full"
absl::StatusOr<Recompute> ParseRecompute(absl::string_view name);
absl::string_view ScheduleName(Schedule s);  // "1f1b" | "gpipe"
absl::StatusOr<Schedule> ParseSchedule(absl::string_view name);

struct Layout {
  int dp = 1;                 // data-parallel size
  int tp = 1;                 // tensor-parallel size
  int pp = 1;                 // pipeline-parallel size (stages)
  int micro_batch = 1;        // sequences per micro-batch (b)
  int num_micro_batches = 1;  // micro-batches per step per data-parallel rank (m)
  Recompute recompute = Recompute::kNone;
  bool zero1 = false;  // shard the optimizer state over dp
  Schedule schedule = Schedule::k1F1B;

  int world() const { return dp * tp * pp; }
};

// "tp=8 pp=4 dp=32 micro_batch=1 micro_batches=48 recompute=selective zero1=on 1f1b"
std::string LayoutString(const Layout& l);

// Micro-batches whose activations stage `stage` holds at its peak: min(pp − stage, m) under
// 1F1B (so the first stage holds pp), m under GPipe.
int MicroBatchesInFlight(const Layout& l, int stage);

// Fraction of a pipeline step spent idle in the fill and drain: (p − 1)/(m + p − 1), the same
// for 1F1B and GPipe (Narayanan et al. 2021, §2.2), 0 without a pipeline.
double BubbleFraction(int pp, int num_micro_batches);

}  // namespace loom::planner
