// CPU sum of squares for the global gradient norm. Contract: kernels/grad_norm.h.
//
// Determinism: x is cut into fixed blocks of kBlock elements, independent of the thread count;
// each block is summed in double by one thread, and the block sums are added in block order by
// one thread. So the result is the same bit for bit for any number of threads.
#include "kernels/grad_norm.h"

#include <algorithm>
#include <vector>

#include "kernels/arg_check.h"

namespace loom::kernels::cpu {
namespace {

constexpr long kBlock = 1 << 14;

}  // namespace

double sum_of_squares(const float* x, long n) {
  LOOM_KERNEL_CHECK(x != nullptr, "null buffer");
  LOOM_KERNEL_CHECK(n > 0, "n must be positive");
  const long blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks);  // (blocks)
#pragma omp parallel for schedule(static)
  for (long k = 0; k < blocks; ++k) {
    const long i0 = k * kBlock;
    const long i1 = std::min(n, i0 + kBlock);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (long i = i0; i < i1; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[k] = sum;
  }
  double total = 0.0;
  for (long k = 0; k < blocks; ++k) total += partial[k];
  return total;
}

}  // namespace loom::kernels::cpu
