// The training loop's core: one optimizer step = K micro-batches of forward and backward with
// gradient accumulation, the mean of the gradients over the data-parallel ranks (bucketed
// all-reduces overlapping the last micro-batch's backward, parallel/grad_buckets.h), global
// norm clipping, and an AdamW update at the scheduled learning rate. Deterministic: the same
// seed, data and batch shape give the same bits on a given machine, resumed or not; the same
// global batch gives the same losses under any dp, up to the order of the reductions.
#ifndef LOOM_WORKER_TRAIN_TRAINER_H_
#define LOOM_WORKER_TRAIN_TRAINER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/parallel/grad_buckets.h"
#include "worker/train/profiler/step_profiler.h"

namespace loom::train {

struct StepResult {
  int64_t step = 0;        // completed optimizer steps, 1-based (the contract's "step")
  float loss = 0.0f;       // mean training loss over the step's micro-batches, all dp ranks
  double lr = 0.0;         // learning rate used
  double grad_norm = 0.0;  // global gradient norm before clipping
  StepTimes times;         // phase kCommExposed: waiting on the dp all-reduces
  size_t allreduce_bytes = 0;  // bytes this rank all-reduced in the step (0 when dp = 1)
  size_t memory_bytes = 0;       // bytes allocated by the training core now
  size_t peak_memory_bytes = 0;  // and at most so far
  size_t rss_bytes = 0;          // resident set size of the process
};

class Trainer {
 public:
  // Builds the model (GPT-2 initialisation from config.seed) and the optimizer. `data` must
  // outlive the trainer. `dp` is the data-parallel group (size shape.dp_size, rank
  // shape.dp_rank; it must outlive the trainer); nullptr or a group of one trains alone.
  // Gradients travel in buckets of at most `bucket_bytes`.
  Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
          Communicator* dp = nullptr, size_t bucket_bytes = kDefaultBucketBytes);

  // Runs one optimizer step. Throws InputError when the loss is not finite (diverged),
  // CommError when a data-parallel collective failed.
  StepResult Step();

  // Mean loss over the fixed validation batches (at most kMaxEvalBatches micro-batches).
  float Evaluate();

  // Saves a checkpoint of the current state under `root`; returns its directory.
  std::string Save(const std::string& root, int64_t generation) const;

  // Continues from the checkpoint in `dir` (LoadCheckpoint). Returns its metadata.
  CheckpointMeta Resume(const std::string& dir);

  int64_t step() const { return step_; }
  GPT& model() { return model_; }
  const GPT& model() const { return model_; }
  AdamW& optimizer() { return optimizer_; }
  const BatchShape& shape() const { return shape_; }
  size_t num_buckets() const { return buckets_ ? buckets_->num_buckets() : 0; }
  size_t bytes_allocated() const;

  static constexpr int kMaxEvalBatches = 32;

 private:
  JobConfig config_;
  BatchShape shape_;
  const Dataset& data_;
  Communicator* dp_;                      // nullptr when training alone
  std::unique_ptr<GradBuckets> buckets_;  // set when dp_ has more than one rank
  GPT model_;
  AdamW optimizer_;
  LrSchedule schedule_;
  BatchSampler sampler_;
  EvalBatches eval_batches_;
  std::vector<int> inputs_;   // (B, T)
  std::vector<int> targets_;  // (B, T)
  StepProfiler profiler_;
  MemoryMeter memory_;
  int64_t step_ = 0;  // completed optimizer steps
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_TRAINER_H_
