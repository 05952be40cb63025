// What a CPU device of this node achieves, measured with the training core's own kernels
// (issue 12, part 7): loom-worker runs `loom-train --measure-device` once when it starts and
// reports the figures with its devices; loomd's planner uses them instead of its catalog's
// guesses (server/planner/measured_peaks.h), calibration then correcting what remains.
//
// Measured, each the median of a few timed repetitions after one warm-up:
//   - matmul forward + backward (kernels/matmul.h) at one shape per GEMM class of the planner
//     (smallest dimension 64, 256, 1024: the CPU classes small, medium, large);
//   - one whole GPT block forward + backward (every kernel of it: layernorms, attention, GELU,
//     residuals, the four projections) at two shapes, which lets the planner fit its
//     element-wise bandwidth and per-block overhead to what the block really costs;
//   - AdamW over fp32 master weights (the optimizer phase).
// About one second on a small machine (loom-worker runs it three times). Single process, OpenMP threads as a rank has.
#ifndef LOOM_WORKER_TRAIN_MEASURE_DEVICE_PEAKS_H_
#define LOOM_WORKER_TRAIN_MEASURE_DEVICE_PEAKS_H_

#include <string>
#include <vector>

namespace loom::train {

struct GemmSample {
  int rows = 0, inner = 0, cols = 0;  // (rows, inner) @ (inner, cols): the planner's b·s, C, OC
  double flops_per_second = 0;        // 6·rows·inner·cols per forward + backward over the time
};

struct BlockSample {
  int hidden = 0, heads = 0, seq_len = 0, micro_batch = 0;
  double seconds = 0;  // one block, forward + backward, one micro-batch
};

struct CpuPeaks {
  std::vector<GemmSample> gemm;
  std::vector<BlockSample> blocks;
  double optimizer_bytes_per_second = 0;  // 28 bytes per parameter (the planner's AdamW model)
  int threads = 1;
  double measure_seconds = 0;
};

// Runs the measurement (seconds of full CPU use). Deterministic inputs, fresh random values.
CpuPeaks MeasureCpuPeaks();

// One JSON object on one line: {"event":"device_peaks","device":"cpu","gemm":[{rows,inner,
// cols,flops_per_second}...],"blocks":[{hidden,heads,seq_len,micro_batch,seconds}...],
// "optimizer_bytes_per_second":x,"threads":n,"measure_seconds":s} (docs/rank-contract.md).
std::string CpuPeaksJson(const CpuPeaks& peaks);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MEASURE_DEVICE_PEAKS_H_
