#include "worker/train/trainer.h"

#include <cmath>

#include "worker/train/error.h"

namespace loom::train {
namespace {

AdamWConfig AdamFrom(const JobConfig& c) {
  AdamWConfig a;
  a.weight_decay = static_cast<float>(c.weight_decay);
  return a;
}

LrSchedule ScheduleFrom(const JobConfig& c) {
  return LrSchedule{c.lr, c.warmup_steps, c.steps, c.min_lr_ratio};
}

}  // namespace

Trainer::Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                 Communicator* dp, size_t bucket_bytes)
    : config_(config),
      shape_(shape),
      data_(data),
      dp_(dp),
      model_(config.model),
      optimizer_(model_.num_params(), AdamFrom(config)),
      schedule_(ScheduleFrom(config)),
      sampler_(data.train(), config.seed, shape.B, shape.T, shape.K, shape.dp_rank),
      eval_batches_(data.val(), shape.B, shape.T, kMaxEvalBatches),
      inputs_(static_cast<size_t>(shape.B) * shape.T),
      targets_(static_cast<size_t>(shape.B) * shape.T) {
  model_.InitWeights(config.seed);
  if (dp_ != nullptr) {
    LOOM_CHECK(dp_->size() == shape.dp_size && dp_->rank() == shape.dp_rank,
               "the data-parallel communicator does not match the batch shape's dp rank/size");
  }
  if (dp_ != nullptr && dp_->size() > 1) {
    buckets_ = std::make_unique<GradBuckets>(model_.tensors(), config.model.layers, bucket_bytes,
                                             dp_);
  }
}

StepResult Trainer::Step() {
  const int B = shape_.B, T = shape_.T, K = shape_.K;
  profiler_.BeginStep();
  model_.ZeroGrad();
  if (buckets_) buckets_->Begin(model_.grads());
  double loss_sum = 0.0;
  for (int micro = 0; micro < K; ++micro) {
    profiler_.Enter(Phase::kData);
    sampler_.Fill(step_, micro, inputs_.data(), targets_.data());
    profiler_.Enter(Phase::kForward);
    loss_sum += model_.Forward(inputs_.data(), targets_.data(), B, T);
    profiler_.Enter(Phase::kBackward);
    // The step's loss is the mean over its K micro-batches. Only the last micro-batch's
    // backward launches buckets: accumulation communicates once per step.
    GPT::GradReadyFn ready;
    if (buckets_ && micro == K - 1) ready = [this](int stage) { buckets_->StageReady(stage); };
    model_.Backward(1.0f / K, ready);
  }
  float loss = static_cast<float>(loss_sum / K);
  StepResult r;
  if (buckets_) {
    // The loss travels last, behind the gradient buckets: the mean over dp of the ranks' means
    // is the global batch's mean (every rank has the same K * B sequences).
    float loss_mean = loss;
    WorkHandle loss_work = dp_->AllReduceSum(&loss_mean, 1);
    profiler_.Enter(Phase::kCommExposed);
    buckets_->Finish();
    loss_work->Wait();
    loss = loss_mean / static_cast<float>(dp_->size());
    r.allreduce_bytes = buckets_->bytes_per_step() + sizeof(float);
  }
  profiler_.Enter(Phase::kOptimizer);
  if (!std::isfinite(loss)) {
    throw BadInput("train.lr", "the loss became " + std::to_string(loss) + " at step " +
                                   std::to_string(step_ + 1) +
                                   ": training diverged (lower the learning rate)");
  }
  r.grad_norm = GradNorm(model_.grads(), model_.tensors());
  ClipGradients(model_.grads(), model_.num_params(), r.grad_norm, config_.grad_clip);
  r.lr = LearningRate(schedule_, step_);
  optimizer_.Update(model_.params(), model_.grads(), model_.tensors(), static_cast<float>(r.lr));
  ++step_;
  r.times = profiler_.EndStep(int64_t{B} * T * K);
  r.step = step_;
  r.loss = loss;
  memory_.Record(bytes_allocated());
  r.memory_bytes = memory_.in_use();
  r.peak_memory_bytes = memory_.peak();
  r.rss_bytes = ResidentSetBytes();
  return r;
}

float Trainer::Evaluate() {
  double sum = 0.0;
  for (int i = 0; i < eval_batches_.num_batches(); ++i) {
    eval_batches_.Fill(i, inputs_.data(), targets_.data());
    sum += model_.Forward(inputs_.data(), targets_.data(), shape_.B, shape_.T);
  }
  return static_cast<float>(sum / eval_batches_.num_batches());
}

std::string Trainer::Save(const std::string& root, int64_t generation) const {
  CheckpointMeta meta;
  meta.step = step_;
  meta.seed = config_.seed;
  meta.generation = generation;
  meta.B = shape_.B;
  meta.T = shape_.T;
  meta.K = shape_.K;
  meta.dp_size = shape_.dp_size;
  meta.dims = model_.dims();
  return SaveCheckpoint(root, model_, optimizer_, meta);
}

CheckpointMeta Trainer::Resume(const std::string& dir) {
  CheckpointMeta meta = LoadCheckpoint(dir, &model_, &optimizer_);
  step_ = meta.step;
  return meta;
}

size_t Trainer::bytes_allocated() const {
  return model_.bytes_allocated() + optimizer_.bytes_allocated() + data_.bytes_owned() +
         (inputs_.capacity() + targets_.capacity()) * sizeof(int);
}

}  // namespace loom::train
