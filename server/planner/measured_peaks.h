// Device figures measured on the node (issue 12, part 7) instead of the catalog's guesses.
//
// loom-worker measures its CPU devices with the training core's own kernels when it starts
// (worker/train/measure/device_peaks.h) and reports them with its devices (Device.peaks). The
// planner turns them into the numbers its time model uses, so that the first prediction on a
// fresh cluster is already close; calibration (server/calibration) then corrects what remains,
// keyed apart from the catalog's ("cpu@measured"), since its scales correct a different table.
//
//   GEMMs: the matmul rate measured at each GEMM class's shape becomes that class's rate
//     (peak_flops = the fastest class, the class fractions = rate / peak). A class not measured
//     takes the nearest measured one's.
//   Blocks: the time model charges a block forward + backward as GEMMs + element-wise bytes /
//     bandwidth + a fixed overhead (BlockCost). With the GEMM rates fitted, the measured whole
//     blocks (every kernel: attention, layernorms, GELU, residuals) leave two unknowns, the
//     element-wise bandwidth and the fixed overhead, solved by least squares over the samples
//     (exactly with two). A fit that is not physical (negative) falls back to no overhead and the
//     bandwidth that explains the largest sample.
//   Optimizer: AdamW's measured bytes per second, through the table's optimizer factor.
//   Sharing: every CPU device of a node computes on the same cores, each measured alone; with
//     several ranks of one job on a node they share them (shares_node_compute).
// Pure.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "server/planner/device_spec.h"

namespace loom::planner {

struct MeasuredGemm {
  int rows = 0, inner = 0, cols = 0;
  double flops_per_s = 0;  // forward + backward: 6·rows·inner·cols per second
};

struct MeasuredBlock {
  int hidden = 0, heads = 0, seq_len = 0, micro_batch = 0;
  double seconds = 0;  // one block, forward + backward, one micro-batch
};

struct MeasuredPeaks {
  std::vector<MeasuredGemm> gemm;
  std::vector<MeasuredBlock> blocks;
  double optimizer_bytes_per_s = 0;  // 0: not measured
};

// INVALID_ARGUMENT naming the field ("peaks.gemm[1].flops_per_second") when a figure is not
// finite, not positive, or outside what any device could do; a shape that is not positive or
// absurdly large; more than 16 samples of a kind. Empty lists are valid (nothing measured).
absl::Status ValidateMeasuredPeaks(const MeasuredPeaks& m);

// `catalog` (a DeviceSpec of the catalog, e.g. DefaultDevice("cpu", ...)) with its compute
// figures replaced by the measured ones as described above; `measured` is set and the
// calibration key becomes "<model>@measured". Requires at least one GEMM sample (else returns
// `catalog` unchanged). Precision: the samples are fp32; peak_flops is stored so that the fp32
// rate (peak × fp32_peak_ratio) equals the measurement.
DeviceSpec ApplyMeasuredPeaks(DeviceSpec catalog, const MeasuredPeaks& m);

// The key calibration is stored under for these devices: the model, or "<model>@measured".
std::string CalibrationKey(const DeviceSpec& d);

}  // namespace loom::planner
