// AdamW optimizer update (Loshchilov & Hutter), decoupled weight decay.
#ifndef LOOM_KERNELS_ADAMW_H_
#define LOOM_KERNELS_ADAMW_H_

namespace loom::kernels::cpu {

// For each i in [0, n):
//   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
//   mhat = m / (1 - beta1^t);   vhat = v / (1 - beta2^t)
//   p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
// params, m, v (n) are updated in place; grads (n) is read. t >= 1 is the 1-based step.
void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_ADAMW_H_
