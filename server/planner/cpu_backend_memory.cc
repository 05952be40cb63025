#include "server/planner/cpu_backend_memory.h"

#include "absl/status/status.h"

namespace loom::planner {

absl::StatusOr<MemoryBreakdown> CpuBackendMemory(const ModelShape& m, Precision precision,
                                                 const Layout& layout) {
  if (precision != Precision::kFp32) {
    return absl::InvalidArgumentError("precision: the CPU backend trains in fp32 only");
  }
  if (layout.tp != 1 || layout.pp != 1) {
    return absl::InvalidArgumentError(
        "layout: the CPU backend runs data parallelism only (tensor = pipeline = 1)");
  }
  if (layout.recompute != Recompute::kNone || layout.zero1) {
    return absl::InvalidArgumentError(
        "layout: the CPU backend has no activation recompute and no ZeRO-1");
  }
  const double s = m.seq_len, b = layout.micro_batch, h = m.hidden, a = m.heads, v = m.vocab;
  const double sb = s * b, sbh = s * b * h;
  const double attention = a * b * s * s;  // probabilities (forward) or their scratch (backward)
  const double params = TotalParams(m);
  MemoryBreakdown r;
  r.weights = 4.0 * params;
  r.gradients = 4.0 * params;
  r.optimizer = 8.0 * params;
  r.activations = m.layers * 4.0 * (18.0 * sbh + 4.0 * sb + attention);
  r.embedding_and_logits = 4.0 * (2.0 * sbh + 4.0 * sb + 3.0 * sb * v) + 16.0 * sb;
  r.workspace = 4.0 * (14.0 * sbh + attention);
  r.comm_buffers = layout.dp > 1 ? 4.0 * params : 0.0;
  return r;
}

}  // namespace loom::planner
