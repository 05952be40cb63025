// Double-precision reference: softmax + cross-entropy. Contract: crossentropy_ref.h.
#include "kernels/ref/crossentropy_ref.h"

#include <cmath>

namespace loom::kernels::ref {

void softmax_crossentropy_forward(double* losses, double* probs, const double* logits,
                                  const int* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const double* z = logits + static_cast<long>(n) * V;
    double* p = probs + static_cast<long>(n) * V;
    double maxv = z[0];
    for (int i = 1; i < V; ++i) maxv = z[i] > maxv ? z[i] : maxv;
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(z[i] - maxv);
    for (int i = 0; i < V; ++i) p[i] = std::exp(z[i] - maxv) / sum;
    losses[n] = -std::log(p[targets[n]]);
  }
}

void softmax_crossentropy_backward(double* dlogits, const double* probs, const int* targets,
                                   const double* dlosses, int N, int V) {
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < V; ++i) {
      const double onehot = i == targets[n] ? 1.0 : 0.0;
      dlogits[static_cast<long>(n) * V + i] +=
          (probs[static_cast<long>(n) * V + i] - onehot) * dlosses[n];
    }
  }
}

}  // namespace loom::kernels::ref
