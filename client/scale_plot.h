// The scaling sweep's figure as a hand-written SVG (no plotting dependency): on the left the
// efficiency against linear at each size (1 = linear, dashed), on the right a stacked bar per
// size of the time lost against linear as a fraction of the step, split into the measured
// buckets (exposed communication, bubble, imbalance, compute inflation) and what they leave
// unexplained. Pure: a ScaleTest in, a well-formed SVG document out.
#pragma once

#include <string>

#include "loom/v1/scaling.pb.h"

namespace loom::client {

std::string ScalingSvg(const loom::v1::ScaleTest& test);

}  // namespace loom::client
