// The training loop's core: one optimizer step = K micro-batches of forward and backward with
// gradient accumulation, gradient reduction across data-parallel ranks (a hook for now), global
// norm clipping, and an AdamW update at the scheduled learning rate. Deterministic: the same
// seed, data and batch shape give the same bits on a given machine, resumed or not.
#ifndef LOOM_WORKER_TRAIN_TRAINER_H_
#define LOOM_WORKER_TRAIN_TRAINER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/profiler/step_profiler.h"

namespace loom::train {

// Where the data-parallel runtime plugs in: after the K micro-batches of a step, before the
// gradient norm. The parallel runtime (a later issue) implements it with its communicator.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Replaces `grads` (n floats) by their mean over the data-parallel group.
  virtual void AllReduceMean(float* grads, size_t n) = 0;
};

// A data-parallel group of one rank: the mean is the rank's own gradient.
class SingleRankReducer : public GradientReducer {
 public:
  void AllReduceMean(float* grads, size_t n) override {}
};

struct StepResult {
  int64_t step = 0;        // completed optimizer steps, 1-based (the contract's "step")
  float loss = 0.0f;       // mean training loss over the step's micro-batches
  double lr = 0.0;         // learning rate used
  double grad_norm = 0.0;  // global gradient norm before clipping
  StepTimes times;
  size_t memory_bytes = 0;       // bytes allocated by the training core now
  size_t peak_memory_bytes = 0;  // and at most so far
  size_t rss_bytes = 0;          // resident set size of the process
};

class Trainer {
 public:
  // Builds the model (GPT-2 initialisation from config.seed) and the optimizer. `data` must
  // outlive the trainer. `reducer` may be nullptr (a single rank).
  Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
          GradientReducer* reducer = nullptr);

  // Runs one optimizer step. Throws InputError when the loss is not finite (diverged).
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
  size_t bytes_allocated() const;

  static constexpr int kMaxEvalBatches = 32;

 private:
  JobConfig config_;
  BatchShape shape_;
  const Dataset& data_;
  SingleRankReducer single_rank_;
  GradientReducer* reducer_;
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
