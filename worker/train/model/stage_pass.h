// One pipeline stage's micro-batch, forward and backward, written once for both backends: the
// CPU model (gpt.cc) and the GPU model (gpt_cuda.cc) supply the ops, this file the order in
// which they run, what each block's, the embedding's and the head's timing covers (the doctor
// re-splits pipelines from those figures, server/doctor) and when each stage of gradients is
// reported ready (the data-parallel buckets start their all-reduce from that report, so an
// early report would send gradients that are still being written).
//
// A stage holds blocks [first_block, first_block + blocks) of a model of `layers` blocks; the
// first stage also the embedding, the last the final layernorm, the tied output head and the
// loss. Between stages the residual stream (B, T, C) travels forward and its gradient backward.
//
// The Ops contract. Each method works on the micro-batch the ops were made for (its activation
// slot, its tokens, input, targets or output gradient):
//   Embed()           first stage: encoded = wte[tokens] + wpe[positions]          (B, T, C)
//   TakeInput()       other stages: encoded = the previous stage's output          (B, T, C)
//   Block(l)          block_pass.h's BlockForwardPass of local block l
//   Head()            last stage: lnf, logits and, with targets, the loss
//   HeadBackward()    last stage: dresidual = d(loss * loss_scale) / d(last block's output)
//   TakeOutputGrad()  other stages: dresidual = d(output) from the next stage      (B, T, C)
//   BlockBackward(l)  block_pass.h's BlockBackwardPass of local block l
//   EmbedBackward()   first stage: wte and wpe gradients from dresidual
//   Lap()             seconds since the previous Lap (or the ops' creation); a backend whose
//                     ops are queued (CUDA) first waits until they have run. Called only when
//                     costs are being measured.
#ifndef LOOM_WORKER_TRAIN_MODEL_STAGE_PASS_H_
#define LOOM_WORKER_TRAIN_MODEL_STAGE_PASS_H_

#include <cstddef>
#include <functional>

#include "worker/train/profiler/block_costs.h"

namespace loom::train {

// Which part of the model a stage holds.
struct StageShape {
  bool first;       // holds the embedding
  bool last;        // holds the final layernorm, the head and the loss
  int first_block;  // global index of local block 0
  int blocks;       // local blocks
  int layers;       // blocks of the whole model
};

// One micro-batch's forward through the stage. With `costs` (a sampled step), adds the seconds
// of the embedding, each block and the head to it; copies of the stage's input are nobody's
// cost.
template <typename Ops>
void StageForwardPass(Ops& ops, const StageShape& s, BlockCosts* costs) {
  if (costs) ops.Lap();  // earlier work is nobody's cost
  if (s.first) {
    ops.Embed();
    if (costs) {
      costs->has_embedding = true;
      costs->embedding_forward += ops.Lap();
    }
  } else {
    ops.TakeInput();
    if (costs) ops.Lap();
  }
  for (int l = 0; l < s.blocks; ++l) {
    ops.Block(l);
    if (costs) costs->forward[static_cast<size_t>(l)] += ops.Lap();
  }
  if (!s.last) return;
  ops.Head();
  if (costs) {
    costs->has_head = true;
    costs->head_forward += ops.Lap();
  }
}

// One micro-batch's backward through the stage, accumulating into the gradients. `ready` (may be
// empty) is told each stage of gradients the moment this pass will not write it again
// (GPT::GradReadyFn): `layers` after the head (lnfw, lnfb, and wte on a last stage that is not
// also the first), then each block's global index walking down, then -1 after the embedding
// (wte is final only then on a single stage). Work `ready` starts is not the next block's cost.
template <typename Ops>
void StageBackwardPass(Ops& ops, const StageShape& s, BlockCosts* costs,
                       const std::function<void(int stage)>& ready) {
  if (costs) ops.Lap();
  if (s.last) {
    ops.HeadBackward();
    if (costs) {
      costs->has_head = true;
      costs->head_backward += ops.Lap();
    }
    if (ready) ready(s.layers);
  } else {
    ops.TakeOutputGrad();
  }
  // Down the blocks; dresidual carries d(residual stream) from block to block.
  for (int l = s.blocks - 1; l >= 0; --l) {
    if (costs) ops.Lap();
    ops.BlockBackward(l);
    if (costs) costs->backward[static_cast<size_t>(l)] += ops.Lap();
    if (ready) ready(s.first_block + l);
  }
  // dresidual now holds d(stage input): the previous stage's output gradient, or the
  // embedding's.
  if (s.first) {
    if (costs) ops.Lap();
    ops.EmbedBackward();
    if (costs) {
      costs->has_embedding = true;
      costs->embedding_backward += ops.Lap();
    }
    if (ready) ready(-1);
  }
}

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_MODEL_STAGE_PASS_H_
