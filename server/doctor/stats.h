// Robust statistics for the doctor: medians and the median absolute deviation, which a few
// outlying steps (a checkpoint, a noisy neighbour) do not move.
//
// Pure functions.
#pragma once

#include <vector>

namespace loom::doctor {

// The median (the mean of the middle two for an even count); 0 for an empty vector.
double Median(std::vector<double> values);
// The median absolute deviation from the median, scaled by 1.4826 so that it estimates the
// standard deviation of normally distributed values; 0 for fewer than two values.
double Mad(const std::vector<double>& values);

}  // namespace loom::doctor
