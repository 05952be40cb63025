// Double-precision reference of fused softmax + cross-entropy, for tests only.
// Same contracts as kernels/crossentropy.h, with double buffers.
#ifndef LOOM_KERNELS_REF_CROSSENTROPY_REF_H_
#define LOOM_KERNELS_REF_CROSSENTROPY_REF_H_

namespace loom::kernels::ref {

// losses (N), probs (N,V) from logits (N,V) and targets (N).
void softmax_crossentropy_forward(double* losses, double* probs, const double* logits,
                                  const int* targets, int N, int V);
// dlogits (N,V) += (probs - onehot(targets)) * dlosses[n]. Accumulates.
void softmax_crossentropy_backward(double* dlogits, const double* probs, const int* targets,
                                   const double* dlosses, int N, int V);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_CROSSENTROPY_REF_H_
