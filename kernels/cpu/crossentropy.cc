// CPU fp32 fused softmax + cross-entropy. Contract: kernels/crossentropy.h.
//
// The row sum of exponentials is accumulated in double: with V around 50k classes a float sum
// loses about log2(V) bits, and the loss is log(sum) - (logit[target] - max) straight from the
// logits, so a tiny probability never goes through log(prob).
// Threading: rows are split statically across OpenMP threads; each row is one thread's.
#include "kernels/crossentropy.h"

#include <cmath>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

void CheckTargets(const int* targets, int N, int V) {
  LOOM_KERNEL_CHECK(N > 0 && V > 0, "N and V must be positive");
  for (int n = 0; n < N; ++n) {
    LOOM_KERNEL_CHECK(targets[n] >= 0 && targets[n] < V, "target out of range [0, V)");
  }
}

}  // namespace

void softmax_crossentropy_forward(float* losses, float* probs, const float* logits,
                                  const int* targets, int N, int V) {
  LOOM_KERNEL_CHECK(losses && probs && logits && targets, "null buffer");
  CheckTargets(targets, N, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* z = logits + static_cast<long>(n) * V;  // (V)
    float* p = probs + static_cast<long>(n) * V;         // (V)
    float maxv = z[0];
    for (int i = 1; i < V; ++i) maxv = std::fmax(maxv, z[i]);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) {
      const float e = std::exp(z[i] - maxv);
      p[i] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int i = 0; i < V; ++i) p[i] *= inv;
    losses[n] = static_cast<float>(std::log(sum) - (double{z[targets[n]]} - maxv));
  }
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets,
                                   const float* dlosses, int N, int V) {
  LOOM_KERNEL_CHECK(dlogits && probs && targets && dlosses, "null buffer");
  CheckTargets(targets, N, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* p = probs + static_cast<long>(n) * V;  // (V)
    float* dz = dlogits + static_cast<long>(n) * V;     // (V)
    const float dl = dlosses[n];
    for (int i = 0; i < V; ++i) dz[i] += p[i] * dl;
    dz[targets[n]] -= dl;
  }
}

}  // namespace loom::kernels::cpu
