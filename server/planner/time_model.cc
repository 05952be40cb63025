#include "server/planner/time_model.h"

#include <algorithm>
#include <cmath>

#include "server/planner/memory_model.h"

namespace loom::planner {
namespace {

// AdamW bytes moved per parameter: fp32 master weight r/w (8), m r/w (8), v r/w (8), gradient
// read and working weight write (2 + 2 in bf16; in fp32 the weight is the master, and the
// 4-byte gradient read makes the same 28).
constexpr double kOptimizerBytesPerParam = 28.0;

double MemorySeconds(const DeviceSpec& d, double bytes) {
  return bytes / (d.memory_bandwidth_bytes_per_s * d.efficiency.memory_bandwidth);
}

}  // namespace

double EffectiveFlops(const DeviceSpec& d, Precision precision, double smallest_dim) {
  const double peak =
      precision == Precision::kFp32 ? d.peak_flops * d.efficiency.fp32_peak_ratio : d.peak_flops;
  return peak * d.efficiency.GemmFraction(smallest_dim);
}

Link GroupLink(const DeviceSpec& d, int size, int stride) {
  const EfficiencyTable& e = d.efficiency;
  Link link;
  const int per_node = std::max(1, d.per_node);
  const int on_node = stride >= per_node ? 1 : std::max(1, std::min(size, per_node / stride));
  link.nodes = (size + on_node - 1) / on_node;
  link.spans_nodes = link.nodes > 1;
  const double nvlink = d.intra_node_bytes_per_s * e.allreduce_intra;
  if (!link.spans_nodes) {
    link.bytes_per_s = nvlink;
    link.latency_s = e.latency_intra_s;
    return link;
  }
  // The node's network is shared by the per_node/on_node groups of this kind on the node.
  const double network = d.inter_node_bytes_per_s * on_node / per_node * e.allreduce_inter;
  link.bytes_per_s = std::min(nvlink, network);
  link.latency_s = e.latency_inter_s;
  return link;
}

double AllReduceSeconds(double bytes, int size, const Link& link) {
  if (size <= 1) return 0.0;
  const double g = size;
  const double steps = 2.0 * std::ceil(std::log2(g));
  return 2.0 * (g - 1.0) / g * bytes / link.bytes_per_s + steps * link.latency_s;
}

BlockTime BlockCost(const ModelShape& m, Precision precision, const Layout& l,
                    const DeviceSpec& d) {
  const double s = m.seq_len, b = l.micro_batch, h = m.hidden, t = l.tp;
  const double flops_per_s = EffectiveFlops(d, precision, std::min(b * s, h / t));
  BlockTime r;
  const double elementwise =
      MemorySeconds(d, ActivationBytes(precision) * b * s * (10.0 * h + 8.0 * h / t));
  const double gemm = b * s * (24.0 * h * h + 2.0 * s * h) / t / flops_per_s;
  const double overhead = d.efficiency.block_overhead_s;
  r.forward = gemm + elementwise + overhead / 3.0;
  r.backward = 2.0 * r.forward;
  if (l.recompute == Recompute::kFull) r.recompute = r.forward;  // replays kernels and all
  if (l.recompute == Recompute::kSelective) r.recompute = b * s * 2.0 * s * h / t / flops_per_s;
  if (l.tp > 1) {
    const int all_reduces = l.recompute == Recompute::kFull ? 6 : 4;
    r.tp_comm = all_reduces * AllReduceSeconds(ActivationBytes(precision) * b * s * h, l.tp,
                                               GroupLink(d, l.tp, 1));
  }
  return r;
}

BlockTime FirstStageExtra(const ModelShape& m, Precision precision, const Layout& l,
                          const DeviceSpec& d) {
  const double bsh = double(m.seq_len) * l.micro_batch * m.hidden;
  const double act = ActivationBytes(precision);
  BlockTime r;
  // Forward gathers token and position rows and writes their sum; backward reads the incoming
  // gradient and accumulates it into both tables' gradients.
  r.forward = MemorySeconds(d, 3.0 * act * bsh);
  r.backward = MemorySeconds(d, 3.0 * act * bsh);
  if (l.tp > 1) r.tp_comm = AllReduceSeconds(act * bsh, l.tp, GroupLink(d, l.tp, 1));
  return r;
}

BlockTime LastStageExtra(const ModelShape& m, Precision precision, const Layout& l,
                         const DeviceSpec& d) {
  const double s = m.seq_len, b = l.micro_batch, h = m.hidden, t = l.tp;
  const double v_per_rank = double(m.vocab) / t;
  const double act = ActivationBytes(precision);
  const double flops_per_s = EffectiveFlops(d, precision, std::min({b * s, h, v_per_rank}));
  const double logits = b * s * v_per_rank;
  BlockTime r;
  // Final layernorm (read, write; backward reads two, writes one), head GEMM, and the softmax
  // cross-entropy reading the logits and writing an fp32 softmax (backward: the reverse).
  r.forward = MemorySeconds(d, 2.0 * act * b * s * h) + 2.0 * b * s * h * v_per_rank / flops_per_s +
              MemorySeconds(d, (act + 4.0) * logits);
  r.backward = MemorySeconds(d, 3.0 * act * b * s * h) +
               4.0 * b * s * h * v_per_rank / flops_per_s + MemorySeconds(d, (act + 4.0) * logits);
  if (l.tp > 1) r.tp_comm = AllReduceSeconds(act * b * s * h, l.tp, GroupLink(d, l.tp, 1));
  return r;
}

double PipelineTransferSeconds(const ModelShape& m, Precision precision, const Layout& l,
                               const DeviceSpec& d) {
  if (l.pp <= 1) return 0.0;
  const EfficiencyTable& e = d.efficiency;
  const double bytes = ActivationBytes(precision) * m.seq_len * l.micro_batch * m.hidden;
  const int stride = l.tp * l.dp;  // rank distance between adjacent stages
  const int per_node = std::max(1, d.per_node);
  const bool crosses = l.world() > per_node;
  double bw = d.intra_node_bytes_per_s;
  double latency = e.latency_intra_s;
  if (crosses) {
    // The ranks of a stage that send across a node boundary at once share that node's network.
    bw = std::min(bw, d.inter_node_bytes_per_s / std::min(per_node, stride));
    latency = e.latency_inter_s;
  }
  return bytes / (bw * e.p2p) + latency;
}

DataParallelTime DataParallelCost(Precision precision, const Layout& l, const DeviceSpec& d,
                                  double params, double backward_window_s) {
  DataParallelTime r;
  r.gradient_bytes = params * (precision == Precision::kBf16 ? 2.0 : 4.0);
  if (l.dp <= 1) return r;
  const double g = l.dp;
  r.wire_bytes = 2.0 * (g - 1.0) / g * r.gradient_bytes;
  const Link link = GroupLink(d, l.dp, l.tp);
  r.total = AllReduceSeconds(r.gradient_bytes, l.dp, link);
  const double last_bucket = r.total * std::min(1.0, kDpBucketBytes / r.gradient_bytes);
  if (!l.zero1) {
    r.exposed = std::max(r.total - backward_window_s, last_bucket);
  } else {
    // Reduce-scatter half overlapped like the all-reduce; the all-gather half is exposed.
    r.exposed = std::max(r.total / 2 - backward_window_s, last_bucket / 2) + r.total / 2;
  }
  return r;
}

StepTime EstimateStep(const ModelShape& m, Precision precision, const Layout& l,
                      const DeviceSpec& devices, const std::vector<int>& blocks_per_stage) {
  // Measured CPU devices of one node share its cores (DeviceSpec::shares_node_compute): the
  // job's ranks on one node each compute at 1/k of the rate measured alone.
  DeviceSpec d = devices;
  if (d.shares_node_compute) {
    const int ranks_on_node = std::min(l.world(), std::max(1, d.per_node));
    if (ranks_on_node > 1) d.efficiency = ScaleEfficiency(d.efficiency, ranks_on_node, 1.0);
  }
  const BlockTime block = BlockCost(m, precision, l, d);
  const BlockTime first = FirstStageExtra(m, precision, l, d);
  const BlockTime last = LastStageExtra(m, precision, l, d);
  const double p2p = l.pp > 1 ? 2.0 * PipelineTransferSeconds(m, precision, l, d) : 0.0;
  const double mem_bw = d.memory_bandwidth_bytes_per_s * d.efficiency.memory_bandwidth;

  StepTime r;
  double slowest_slot = -1, slot_sum = 0;
  double f_s = 0, b_s = 0, rc_s = 0, c_s = 0;
  for (int i = 0; i < l.pp; ++i) {
    const double n = blocks_per_stage[i];
    double f = n * block.forward, bw = n * (block.backward + block.recompute);
    double rc = n * block.recompute, c = n * block.tp_comm;
    if (i == 0) f += first.forward, bw += first.backward, c += first.tp_comm;
    if (i == l.pp - 1) f += last.forward, bw += last.backward, c += last.tp_comm;
    const double slot = f + bw + c + p2p;
    slot_sum += slot;
    if (slot > slowest_slot) {
      slowest_slot = slot;
      r.slowest_stage = i;
      f_s = f, b_s = bw, rc_s = rc, c_s = c;
    }
    const double params = n * BlockParams(m, l.tp) + StageExtraParams(m, l, i);
    const DataParallelTime dp = DataParallelCost(precision, l, d, params, bw);
    r.dp_exposed = std::max(r.dp_exposed, dp.exposed);
    r.dp_total = std::max(r.dp_total, dp.total);
    const double updated = l.zero1 ? params / l.dp : params;
    r.optimizer = std::max(r.optimizer, updated * kOptimizerBytesPerParam /
                                            (mem_bw * d.efficiency.optimizer_bandwidth));
  }
  const double mb = l.num_micro_batches;
  r.forward = mb * f_s;
  r.backward = mb * b_s;
  r.recompute = mb * rc_s;
  r.tp_comm = mb * c_s;
  r.pp_comm = mb * p2p;
  r.bubble = (l.pp - 1) * slowest_slot;
  r.bubble_fraction = BubbleFraction(l.pp, l.num_micro_batches);
  r.comm_exposed = r.tp_comm + r.pp_comm + r.dp_exposed;
  r.total = r.forward + r.backward + r.optimizer + r.comm_exposed + r.bubble;
  r.stage_imbalance = slowest_slot / (slot_sum / l.pp);
  return r;
}

}  // namespace loom::planner
