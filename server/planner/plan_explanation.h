// Plain-words reasons for the layout families the planner did not pick, e.g.
//   "tp=16 pp=1 dp=4: tensor groups span 2 nodes, all-reduce over the network, +41% step time"
//   "tp=8 pp=8 dp=16: 8 micro-batches over 8 stages, 47% bubble, +12% step time"
//   "tp=1 pp=1 dp=64: needs 97.3 GiB per GPU > 80.0 GiB even with micro_batch=1, recompute=full"
//   "tp=8 pp=1 dp=8: GEMMs 512 wide per device run at 35% of peak (best: 65%), +159% step time"
// Each reason names the phase that costs the most against the best layout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/planner/device_spec.h"
#include "server/planner/layout_evaluator.h"
#include "server/planner/model_shape.h"

namespace loom::planner {

struct FamilyOutcome {
  int tp = 1, pp = 1, dp = 1;
  bool batch_splits = false;  // some allowed micro_batch gives dp·micro_batch | global batch
  std::optional<Evaluation> fastest;       // the fastest member that fits
  std::optional<Evaluation> least_memory;  // the member of least peak memory, when none fits
};

std::string ExplainFamily(const FamilyOutcome& family, const Evaluation& best,
                          const ModelShape& model, const DeviceSpec& devices,
                          int64_t global_batch_sequences,
                          const std::vector<int>& micro_batch_sizes);

std::string FormatGiB(double bytes);                // "97.3 GiB"
std::string FormatSeconds(double s);                // "850 ms", "2.41 s"
std::string DeviceNoun(const DeviceSpec& devices);  // "GPU" or "CPU device"

}  // namespace loom::planner
