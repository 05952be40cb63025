// Double-precision reference of the sum of squares, for tests only.
#ifndef LOOM_KERNELS_REF_GRAD_NORM_REF_H_
#define LOOM_KERNELS_REF_GRAD_NORM_REF_H_

namespace loom::kernels::ref {

// Returns sum_i x[i]^2, summed sequentially.
double sum_of_squares(const double* x, long n);

}  // namespace loom::kernels::ref

#endif  // LOOM_KERNELS_REF_GRAD_NORM_REF_H_
