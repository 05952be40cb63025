// Shared helpers for the kernel tests: seeded random inputs, NaN poisoning, the relative-error
// measure used against the double references, and central finite differences.
#ifndef LOOM_TESTS_KERNELS_CHECK_H_
#define LOOM_TESTS_KERNELS_CHECK_H_

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace loom::kernels::testutil {

// The fp32 CPU rule of thumb for ||out - ref|| / ||ref|| (DESIGN.md, "Numerical checks").
inline constexpr double kFp32Tolerance = 1e-5;

// n floats uniform in [lo, hi) from rng. With lo < 0 < hi the values are non-zero almost surely.
inline std::vector<float> RandomFloats(std::mt19937& rng, long n, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// n doubles uniform in [lo, hi) from rng.
inline std::vector<double> RandomDoubles(std::mt19937& rng, long n, double lo = -1.0,
                                         double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

// n ints uniform in [lo, hi_exclusive).
inline std::vector<int> RandomInts(std::mt19937& rng, long n, int lo, int hi_exclusive) {
  std::uniform_int_distribution<int> dist(lo, hi_exclusive - 1);
  std::vector<int> v(n);
  for (int& x : v) x = dist(rng);
  return v;
}

// The same values widened to double, so fp32 and reference see identical inputs.
inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// An output buffer of n quiet NaNs: an element the op forgets to write stays NaN and fails.
inline std::vector<float> Poisoned(long n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// ||out - ref|| / ||ref||. Returns +inf when the sizes differ, when out holds a non-finite value
// (so NaN never passes a `< tolerance` check), or when ref is all zeros (a degenerate test).
template <typename F>
double RelativeError(const std::vector<F>& out, const std::vector<double>& ref) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (out.size() != ref.size()) return kInf;
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = static_cast<double>(out[i]);
    if (!std::isfinite(o)) return kInf;
    diff += (o - ref[i]) * (o - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (norm == 0.0) return kInf;
  return std::sqrt(diff / norm);
}

// sum_i a[i] * b[i].
inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central finite differences (f(x + h e_i) - f(x - h e_i)) / 2h for every element of x. x is
// perturbed in place and restored; objective reads x through whatever captured it.
inline std::vector<double> NumericalGradient(std::vector<double>& x,
                                             const std::function<double()>& objective,
                                             double h = 1e-6) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = objective();
    x[i] = saved - h;
    const double minus = objective();
    x[i] = saved;
    grad[i] = (plus - minus) / (2.0 * h);
  }
  return grad;
}

// The gradient a backward added to a buffer: after - before, elementwise.
inline std::vector<double> Added(const std::vector<double>& after,
                                 const std::vector<double>& before) {
  std::vector<double> d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

// Tolerance for a finite-difference gradient of a double reference: truncation O(h^2) and
// rounding O(eps/h) both sit near 1e-9 relative for h = 1e-6 on the small shapes used.
inline constexpr double kFiniteDifferenceTolerance = 1e-6;

}  // namespace loom::kernels::testutil

#endif  // LOOM_TESTS_KERNELS_CHECK_H_
