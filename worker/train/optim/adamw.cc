#include "worker/train/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/grad_norm.h"
#include "worker/train/error.h"

namespace loom::train {

AdamW::AdamW(size_t num_params, const AdamWConfig& config)
    : AdamW(num_params, config, 0, num_params) {}

AdamW::AdamW(size_t num_params, const AdamWConfig& config, size_t begin, size_t end)
    : config_(config),
      num_params_(num_params),
      begin_(begin),
      end_(end),
      m_(end - begin, 0.0f),
      v_(end - begin, 0.0f) {
  LOOM_CHECK(begin <= end && end <= num_params, "optimizer range outside the parameters");
}

void AdamW::Update(float* params, const float* grads, const std::vector<TensorInfo>& table,
                   float lr) {
  ++step_;
  LOOM_CHECK(step_ <= 0x7fffffff, "optimizer step exceeds the kernel's int range");
  for (const TensorInfo& t : table) {
    LOOM_CHECK(t.offset + t.numel <= num_params_, "parameter table does not fit the optimizer");
    // The part of the tensor inside [begin, end); the update is elementwise, so a tensor cut by
    // the range boundary updates exactly as it would whole.
    const size_t lo = std::max(t.offset, begin_), hi = std::min(t.offset + t.numel, end_);
    if (lo >= hi) continue;
    const float wd = t.decay ? config_.weight_decay : 0.0f;
    loom::kernels::cpu::adamw_update(params + lo, grads + lo, m_.data() + (lo - begin_),
                                     v_.data() + (lo - begin_), static_cast<long>(hi - lo), lr,
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
