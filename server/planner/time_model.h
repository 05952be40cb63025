// Predicted time of one training step, in the profiler's phases (forward, backward, optimizer,
// comm_exposed, bubble) so that predicted and measured steps compare phase by phase.
//
// Compute: FLOPs at the calibrated GEMM fraction of peak. Per block and micro-batch of b
// sequences, per tensor-parallel rank: forward b·s·(24·h² + 2·s·h)/t (the four weight GEMMs,
// 2·12·h² per token, and causal attention QKᵀ and AV, 2·s·h per token), backward twice the
// forward; recompute adds the forward again (full) or the attention core 2·b·s²·h/t
// (selective). The element-wise kernels are memory-bound: per token, the two layernorms and two
// residual adds move 10·h elements and bias + GELU on the MLP's 4h/t slice 8·h/t, forward;
// backward moves twice that. A fixed overhead per block and micro-batch stands for kernel
// launches (EfficiencyTable::block_overhead_s). The head adds 2·b·s·h·V/t forward; embedding, final
// layernorm and the softmax cross-entropy are memory-bound and costed by bytes moved.
//
// Communication, as NCCL's cost model: a ring all-reduce of S bytes over g ranks moves
// 2(g−1)/g·S through each rank's slowest link (bandwidth term) plus 2⌈log₂ g⌉ latency steps
// (the tree NCCL picks when latency dominates). Links: a group inside one node uses NVLink;
// a group spanning nodes shares each node's network with the other groups of its kind on that
// node, so its bandwidth is network_per_node × (its ranks on the node) / (devices per node).
// Tensor parallelism (Megatron, no sequence parallelism): per block two all-reduces of b·s·h
// activations in forward, two in backward, two more when full recompute replays the forward;
// not overlapped. Pipeline: an activation forward and a gradient backward of b·s·h per
// micro-batch at each stage boundary.
//
// Pipeline: the slowest stage sets the pace; a step is (m + p − 1) slots of that stage's
// forward + backward + tensor + pipeline communication per micro-batch, of which p − 1 are the
// fill and drain (the bubble, (p − 1)/(m + p − 1) of the pipeline time).
//
// Data parallelism: the gradient all-reduce (2(d−1)/d of the stage's gradient bytes) runs in
// 25 MiB buckets during the backward of the last micro-batch; what does not fit under that
// backward, and at least the last bucket, is exposed. ZeRO-1 splits it into a reduce-scatter
// (overlapped the same way) and an all-gather of the updated weights after the optimizer
// (exposed).
//
// Optimizer: AdamW is memory-bound: 28 bytes moved per parameter (read and write the fp32
// master weight and both moments, read the gradient, write the working weight) at the
// calibrated fraction of memory bandwidth, over the parameters this device updates.
#pragma once

#include <vector>

#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/model_shape.h"

namespace loom::planner {

// A communication group's effective link: bus bandwidth (bytes/s, the efficiency fraction
// applied) and latency per step.
struct Link {
  double bytes_per_s = 0;
  double latency_s = 0;
  bool spans_nodes = false;
  int nodes = 1;  // nodes the group touches
};

// The link of a group of `size` ranks whose members are `stride` ranks apart in rank order
// (tp groups: stride 1; dp groups: stride tp; adjacent pipeline stages: stride tp·dp).
Link GroupLink(const DeviceSpec& d, int size, int stride);

// Ring all-reduce of `bytes` over `size` ranks on `link`; 0 for size 1.
double AllReduceSeconds(double bytes, int size, const Link& link);

// Cost of one block for one micro-batch on one device, in seconds.
struct BlockTime {
  double forward = 0;
  double backward = 0;   // without recompute
  double recompute = 0;  // extra forward work done during backward
  double tp_comm = 0;    // tensor all-reduces, forward and backward
  double total() const { return forward + backward + recompute + tp_comm; }
};
BlockTime BlockCost(const ModelShape& m, Precision precision, const Layout& layout,
                    const DeviceSpec& d);

// Extra cost of the first stage (embedding) or the last stage (final layernorm, head, loss)
// for one micro-batch.
BlockTime FirstStageExtra(const ModelShape& m, Precision precision, const Layout& layout,
                          const DeviceSpec& d);
BlockTime LastStageExtra(const ModelShape& m, Precision precision, const Layout& layout,
                         const DeviceSpec& d);

// Pipeline send or receive of one micro-batch's activation (or its gradient) between adjacent
// stages; 0 without a pipeline.
double PipelineTransferSeconds(const ModelShape& m, Precision precision, const Layout& layout,
                               const DeviceSpec& d);

// Gradient bytes of `params` parameters and the time of their data-parallel reduction.
struct DataParallelTime {
  double gradient_bytes = 0;
  double wire_bytes = 0;  // 2(d−1)/d × gradient_bytes, what each rank sends
  double total = 0;       // all-reduce (or reduce-scatter + all-gather) time
  double exposed = 0;     // after overlap with one micro-batch's backward
};
DataParallelTime DataParallelCost(Precision precision, const Layout& layout, const DeviceSpec& d,
                                  double params, double backward_window_s);

struct StepTime {
  // The profiler's phases; they sum to total.
  double forward = 0;
  double backward = 0;  // includes recompute
  double optimizer = 0;
  double comm_exposed = 0;
  double bubble = 0;
  double total = 0;
  // Detail of comm_exposed and of the pipeline.
  double tp_comm = 0;
  double pp_comm = 0;
  double dp_exposed = 0;
  double dp_total = 0;   // before overlap
  double recompute = 0;  // the part of backward spent recomputing
  double bubble_fraction = 0;
  int slowest_stage = 0;
  double stage_imbalance = 1;  // slowest stage slot / mean stage slot
};

// The step time of `layout` with blocks_per_stage[i] blocks on stage i.
StepTime EstimateStep(const ModelShape& m, Precision precision, const Layout& layout,
                      const DeviceSpec& d, const std::vector<int>& blocks_per_stage);

// Effective FLOP/s for a GEMM whose smallest dimension is `smallest_dim`.
double EffectiveFlops(const DeviceSpec& d, Precision precision, double smallest_dim);

}  // namespace loom::planner
