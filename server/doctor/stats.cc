#include "server/doctor/stats.h"

#include <algorithm>
#include <cmath>

namespace loom::doctor {

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2.0;
}

double Mad(const std::vector<double>& values) {
  if (values.size() < 2) return 0.0;
  const double m = Median(values);
  std::vector<double> dev;
  dev.reserve(values.size());
  for (double v : values) dev.push_back(std::fabs(v - m));
  return 1.4826 * Median(std::move(dev));
}

}  // namespace loom::doctor
