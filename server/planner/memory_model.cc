#include "server/planner/memory_model.h"

namespace loom::planner {

BytesPerParam ParamBytes(Precision precision, const Layout& layout) {
  const double shard = layout.zero1 ? double(layout.dp) : 1.0;
  if (precision == Precision::kBf16) {
    return {2.0, 2.0, 12.0 / shard};  // bf16 weight and grad; fp32 master, Adam m and v
  }
  return {4.0, 4.0, 8.0 / shard};  // fp32 weight and grad; Adam m and v
}

double BlockActivationBytes(const ModelShape& m, Precision precision, const Layout& layout) {
  const double s = m.seq_len, b = layout.micro_batch, h = m.hidden, a = m.heads, t = layout.tp;
  const double sbh = s * b * h;
  const double scale = ActivationBytes(precision) / 2.0;  // the formula counts 16-bit values
  switch (layout.recompute) {
    case Recompute::kNone:
      return scale * sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
    case Recompute::kSelective:
      return scale * sbh * (10.0 + 24.0 / t);
    case Recompute::kFull:
      return scale * 2.0 * sbh;
  }
  return 0;
}

double StageExtraParams(const ModelShape& m, const Layout& layout, int stage) {
  double p = 0;
  if (stage == 0) p += EmbeddingParams(m, layout.tp);
  if (stage == layout.pp - 1) p += HeadParams(m, layout.tp, layout.pp);
  return p;
}

namespace {

// Buffers of the first and last stage other than parameters, and the communication buffers
// and workspace of any stage; see the header for each term.
struct FixedBuffers {
  double embedding_and_logits = 0;
  double comm = 0;
  double workspace = 0;
};

FixedBuffers Buffers(const ModelShape& m, Precision precision, const Layout& layout, int stage) {
  const double s = m.seq_len, b = layout.micro_batch, h = m.hidden;
  const double act = ActivationBytes(precision);
  const double in_flight = MicroBatchesInFlight(layout, stage);
  FixedBuffers f;
  if (stage == 0) f.embedding_and_logits += 4.0 * s * b * in_flight;  // int32 token ids
  if (stage == layout.pp - 1) {
    const double logits = s * b * double(m.vocab) / layout.tp;
    f.embedding_and_logits += in_flight * (4.0 * s * b              // int32 targets
                                           + 2.0 * act * s * b * h  // final LN input, output
                                           + act * logits);         // saved logits
    f.embedding_and_logits += 4.0 * logits;                         // fp32 softmax / gradient
  }
  if (layout.dp > 1) f.comm += kDpBucketsInFlight * kDpBucketBytes;
  if (layout.pp > 1) f.comm += 2.0 * act * s * b * h;
  Layout full = layout;
  full.recompute = Recompute::kNone;
  f.workspace = BlockActivationBytes(m, precision, full);
  return f;
}

}  // namespace

double StageFixedBytes(const ModelShape& m, Precision precision, const Layout& layout, int stage) {
  const FixedBuffers f = Buffers(m, precision, layout, stage);
  return StageExtraParams(m, layout, stage) * ParamBytes(precision, layout).total() +
         f.embedding_and_logits + f.comm + f.workspace;
}

MemoryBreakdown StageMemory(const ModelShape& m, Precision precision, const Layout& layout,
                            const DeviceSpec& devices, int stage, int num_blocks) {
  const BytesPerParam per = ParamBytes(precision, layout);
  const double params = num_blocks * BlockParams(m, layout.tp) + StageExtraParams(m, layout, stage);
  const FixedBuffers f = Buffers(m, precision, layout, stage);
  MemoryBreakdown r;
  r.weights = params * per.weights;
  r.gradients = params * per.gradients;
  r.optimizer = params * per.optimizer;
  r.activations =
      num_blocks * MicroBatchesInFlight(layout, stage) * BlockActivationBytes(m, precision, layout);
  r.embedding_and_logits = f.embedding_and_logits;
  r.comm_buffers = f.comm;
  r.workspace = f.workspace;
  r.fragmentation = kFragmentationFraction * r.allocated();
  r.runtime_reserve = RuntimeReserveBytes(devices);
  return r;
}

double RuntimeReserveBytes(const DeviceSpec& devices) {
  return devices.model == "cpu" ? 0.0 : kGpuRuntimeReserveBytes;
}

double AllocatableBytes(const DeviceSpec& devices) {
  return (devices.memory_bytes - RuntimeReserveBytes(devices)) / (1.0 + kFragmentationFraction);
}

}  // namespace loom::planner
