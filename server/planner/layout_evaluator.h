// One layout, evaluated: the stage split chosen by the partitioner, memory per stage by
// component, the predicted step in the profiler's phases, and the throughput figures.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/memory_model.h"
#include "server/planner/model_shape.h"
#include "server/planner/time_model.h"

namespace loom::planner {

struct Evaluation {
  Layout layout;
  // Whether every stage fits the device memory. When it does not, blocks_per_stage is the split
  // of least peak memory and peak_memory says how much that still needs.
  bool fits = false;
  std::vector<int> blocks_per_stage;          // stage i runs the next blocks_per_stage[i] blocks
  std::vector<MemoryBreakdown> stage_memory;  // per stage, one device
  int peak_stage = 0;
  MemoryBreakdown peak_memory;  // stage_memory[peak_stage]
  double headroom_bytes = 0;    // device memory − peak total (< 0: does not fit)
  StepTime time;
  double tokens_per_second = 0;
  double model_flops_per_device = 0;  // FLOP/s per device, model FLOPs (no recompute)
  double mfu = 0;                     // model_flops_per_device / peak of the precision used
};

// INVALID_ARGUMENT, naming the field and the nearest valid value, when the layout cannot run:
// tp must divide the heads and the MLP width 4·h, pp ≤ layers, dp·tp·pp = devices,
// dp·micro_batch·micro_batches = global batch in sequences.
absl::Status ValidateLayout(const ModelShape& m, const DeviceSpec& d, const Layout& l,
                            int64_t global_batch_sequences);

// Evaluates a valid layout (ValidateLayout first). Pure and deterministic. On CPU devices
// (model "cpu") the memory is the CPU backend's exact layout (CpuBackendMemory) whenever the
// CPU backend runs the layout; on GPUs it is Loom's GPU backend's exact layout
// (CudaBackendMemory) for the layouts that backend runs (bf16, tp = pp = 1, no recompute, no
// ZeRO-1); otherwise the published formula of memory_model.h.
Evaluation EvaluateLayout(const ModelShape& m, Precision precision, const DeviceSpec& d,
                          const Layout& l);

}  // namespace loom::planner
