#include "worker/train/optim/adamw.h"

#include <cmath>

#include "kernels/adamw.h"
#include "kernels/grad_norm.h"
#include "worker/train/error.h"

namespace loom::train {

AdamW::AdamW(size_t num_params, const AdamWConfig& config)
    : config_(config), m_(num_params, 0.0f), v_(num_params, 0.0f) {}

void AdamW::Update(float* params, const float* grads, const std::vector<TensorInfo>& table,
                   float lr) {
  ++step_;
  LOOM_CHECK(step_ <= 0x7fffffff, "optimizer step exceeds the kernel's int range");
  for (const TensorInfo& t : table) {
    LOOM_CHECK(t.offset + t.numel <= m_.size(), "parameter table does not fit the optimizer");
    const float wd = t.decay ? config_.weight_decay : 0.0f;
    loom::kernels::cpu::adamw_update(params + t.offset, grads + t.offset, m_.data() + t.offset,
                                     v_.data() + t.offset, static_cast<long>(t.numel), lr,
                                     config_.beta1, config_.beta2, config_.eps, wd,
                                     static_cast<int>(step_));
  }
}

double LearningRate(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) return s.peak_lr * static_cast<double>(step + 1) / s.warmup_steps;
  const double min_lr = s.peak_lr * s.min_lr_ratio;
  const int64_t decay_steps = s.total_steps - s.warmup_steps;
  if (decay_steps <= 1) return s.peak_lr;
  // progress 0 at the first step after warmup, 1 at the last step.
  double progress = static_cast<double>(step - s.warmup_steps) / (decay_steps - 1);
  if (progress > 1.0) progress = 1.0;
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_lr + cosine * (s.peak_lr - min_lr);
}

double GradNorm(const float* grads, const std::vector<TensorInfo>& table) {
  double sum = 0.0;
  for (const TensorInfo& t : table) {
    sum += loom::kernels::cpu::sum_of_squares(grads + t.offset, static_cast<long>(t.numel));
  }
  return std::sqrt(sum);
}

float ClipGradients(float* grads, size_t n, double norm, double max_norm) {
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0f;
  const float scale = static_cast<float>(max_norm / norm);
  for (size_t i = 0; i < n; ++i) grads[i] *= scale;
  return scale;
}

}  // namespace loom::train
