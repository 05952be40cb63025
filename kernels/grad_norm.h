// Global gradient norm, piecewise: the sum of squares of one tensor.
#ifndef LOOM_KERNELS_GRAD_NORM_H_
#define LOOM_KERNELS_GRAD_NORM_H_

namespace loom::kernels::cpu {

// Returns sum_i x[i]^2 over x (n), accumulated in double. The caller sums over tensors (and
// ranks) and takes the square root. Deterministic for a fixed thread count.
double sum_of_squares(const float* x, long n);

}  // namespace loom::kernels::cpu

#endif  // LOOM_KERNELS_GRAD_NORM_H_
