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

// AdamW state: the first and second moments m and v, parameter-shaped, and the step count.
class AdamW {
 public:
  AdamW(size_t num_params, const AdamWConfig& config);

  // One update of `params` from `grads` (both laid out by `table`) at learning rate `lr`.
  // Increments step() first, so the bias corrections use the 1-based step.
  void Update(float* params, const float* grads, const std::vector<TensorInfo>& table, float lr);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }
  size_t bytes_allocated() const { return (m_.capacity() + v_.capacity()) * sizeof(float); }

 private:
  AdamWConfig config_;
  std::vector<float> m_;  // (num_params)
  std::vector<float> v_;  // (num_params)
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
