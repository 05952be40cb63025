// Fused softmax + cross-entropy over V classes.
// Conventions (shapes, forward overwrites, backward accumulates): see kernels/README.md.
#ifndef LOOM_KERNELS_CROSSENTROPY_H_
#define LOOM_KERNELS_CROSSENTROPY_H_

namespace loom::kernels::cpu {

// probs (N,V) = softmax(logits (N,V)) per row; losses (N) = -log(probs[n, targets[n]]).
// targets (N), each in [0, V).
void softmax_crossentropy_forward(float* losses, float* probs, const float* logits,
                                  const int* targets, int N, int V);

// dlogits (N,V) += (probs - onehot(targets)) * dlosses[n]. dlosses (N), e.g. 1/N each for a
// mean loss. probs (N,V) as written by the forward. Accumulates.
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets,
                                   const float* dlosses, int N, int V);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_CROSSENTROPY_H_
