// The planner's search: every layout of dp × tp × pp × micro-batch × recompute × ZeRO-1 that
// the model, the batch and the devices allow, evaluated by the memory and time models; those
// that fit, ranked by predicted step time and then memory headroom; one line of reason for every
// family (tp, pp, dp) that did not make the ranking. Pure: request in, decision out.
//
// Search space and pruning:
//  - tp divides the heads, the MLP width 4·h and the device count, and is at most the devices
//    per node (tensor all-reduces stay on NVLink) unless the caller fixes it; the smallest tp
//    beyond a node is still evaluated, to say in the reasons what crossing nodes would cost.
//  - pp divides devices/tp and is at most the layers (stages may hold different numbers of
//    blocks: the partitioner balances them); dp = devices/(tp·pp).
//  - micro_batch from the allowed sizes such that dp·micro_batch divides the global batch; the
//    number of micro-batches follows.
//  - recompute: for a given (tp, pp, micro_batch, zero1), a stronger recompute is evaluated only
//    when the weaker ones do not fit; recompute only adds work, so it can never win otherwise.
//    ZeRO-1 is always evaluated both ways: its exposed all-gather can cost more or less than the
//    optimizer time it saves.
// For a 1T-parameter model on 4,096 devices this is about 600 layouts, each partitioned in O(p)
// per bisection probe (uniform blocks); see tests/bench/planner_bench.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/layout_evaluator.h"
#include "server/planner/model_shape.h"

namespace loom::planner {

struct BatchSpec {
  // Exactly one of the two is > 0; tokens must be a multiple of the model's seq_len.
  int64_t global_batch_sequences = 0;
  int64_t global_batch_tokens = 0;
  std::vector<int> micro_batch_sizes;  // allowed b; empty: 1, 2, 4, 8, 16, 32
};

struct SearchOptions {
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  bool allow_zero1 = true;
  Schedule schedule = Schedule::k1F1B;
  int top_k = 5;
};

// Parts of the layout the caller fixes. A fixed value is honoured even outside SearchOptions
// (e.g. tp beyond a node, or a recompute mode not in the allowed list).
struct LayoutConstraints {
  std::optional<int> tp, pp, dp, micro_batch;
  std::optional<Recompute> recompute;
  std::optional<bool> zero1;
  bool any() const { return tp || pp || dp || micro_batch || recompute || zero1; }
};

struct PlanRequest {
  ModelShape model;
  Precision precision = Precision::kBf16;
  BatchSpec batch;
  DeviceSpec devices;
  SearchOptions options;
  LayoutConstraints fixed;
};

struct RejectedFamily {
  int tp = 1, pp = 1, dp = 1;
  // One line in plain words, e.g. "tp=1 pp=1 dp=64: needs 97.3 GiB per GPU > 80.0 GiB even
  // with micro_batch=1, recompute=full, zero1=on".
  std::string reason;
};

struct PlanResult {
  // Layouts that fit, best first, at most options.top_k; when `fixed` constrains anything, only
  // layouts that honour it.
  std::vector<Evaluation> ranked;
  // The best layout without the constraints, for comparison; set when `fixed` has any value.
  std::optional<Evaluation> best_unconstrained;
  std::vector<RejectedFamily> rejected;  // closest to the best first
  int64_t global_batch_sequences = 0;
  int layouts_evaluated = 0;
};

// Errors: INVALID_ARGUMENT for malformed input or fixed values no layout can honour (naming the
// field and the nearest valid value); FAILED_PRECONDITION when nothing fits the memory, naming
// the closest feasible alternative ("needs at least 16 GPUs of 80 GiB, or recompute: full").
absl::StatusOr<PlanResult> PlanLayouts(const PlanRequest& request);

}  // namespace loom::planner
