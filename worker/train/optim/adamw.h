// The optimizer: AdamW over the model's parameter tensors (weight decay only on matrices),
// the learning-rate schedule, and global gradient-norm clipping.
#ifndef LOOM_WORKER_TRAIN_OPTIM_ADAMW_H_
#define LOOM_WORKER_TRAIN_OPTIM_ADAMW_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/train/model/params.h"

namespace loom::train {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to tensors with TensorInfo::decay only
};

// AdamW state: the first and second moments m and v and the step count, for the range
// [begin, end) of a parameter buffer of num_params floats: the whole buffer by default, one
// data-parallel rank's shard under ZeRO-1 (parallel/zero_optimizer.h). m() and v() hold the
// range's end - begin floats.
class AdamW {
 public:
  AdamW(size_t num_params, const AdamWConfig& config);
  AdamW(size_t num_params, const AdamWConfig& config, size_t begin, size_t end);

  // One update of the range of `params` from `grads` (both full buffers laid out by `table`) at
  // learning rate `lr`; the rest of `params` is untouched. Increments step() first, so the bias
  // corrections use the 1-based step.
  void Update(float* params, const float* grads, const std::vector<TensorInfo>& table, float lr);

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }
  size_t bytes_allocated() const { return (m_.capacity() + v_.capacity()) * sizeof(float); }

 private:
  AdamWConfig config_;
  size_t num_params_ = 0;
  size_t begin_ = 0, end_ = 0;
  std::vector<float> m_;  // (end - begin)
  std::vector<float> v_;  // (end - begin)
  int64_t step_ = 0;
};

struct LrSchedule {
  double peak_lr = 6e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;
};

// The learning rate of optimizer step `step` (0-based): linear warmup from peak/warmup to peak
// over the first warmup_steps, then cosine decay from peak to min_lr_ratio * peak at the last
// step.
double LearningRate(const LrSchedule& schedule, int64_t step);

// The global L2 norm of `grads` (n floats), summed tensor by tensor in double.
double GradNorm(const float* grads, const std::vector<TensorInfo>& table);

// Scales `grads` so that their global norm is at most max_norm (no-op when max_norm <= 0 or the
// norm is already within it). Returns the scale applied (1 when none).
float ClipGradients(float* grads, size_t n, double norm, double max_norm);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_OPTIM_ADAMW_H_
